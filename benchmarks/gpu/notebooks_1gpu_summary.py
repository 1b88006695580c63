"""Summary of benchmarks/gpu/notebooks_1gpu.sh: one line per notebook run, and the loss curves of ddp_retinanet and
ddp_two_tower before (e48f795) and after the rewrite side by side.  Usage: python3 notebooks_1gpu_summary.py OUT"""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.stem != "summary"}
SPEEDS = ("tokens_per_s", "images_per_s", "samples_per_s")


def tenths(losses):
    """The mean of each tenth of a loss curve (the same steps before and after)."""
    n = max(1, len(losses) // 10)
    return [round(sum(losses[i:i + n]) / len(losses[i:i + n]), 4) for i in range(0, len(losses) - n + 1, n)][:10]


def gib(values):
    values = [v for v in (values if isinstance(values, list) else [values]) if isinstance(v, (int, float))]
    return round(max(values) / 2**30, 1) if values else None


summary = {}
for name, m in runs.items():
    row = {"world_size": m.get("world_size"), "initial_loss": m.get("initial_loss"), "final_loss": m.get("final_loss"),
           "peak_memory_gib": gib(m.get("peak_memory_bytes")), "device": (m.get("device") or [None])[0]}
    row.update({k: m[k] for k in SPEEDS if isinstance(m.get(k), (int, float))})
    row.update({k: m[k] for k in ("val_map", "test_auroc", "mfu") if m.get(k) is not None})
    summary[name] = row
    print(name, json.dumps(row))

for model in ("retinanet", "two_tower"):
    before, after = runs.get(f"{model}_before"), runs.get(f"{model}_after")
    if not (before and after):
        continue
    a, b = before["losses"], after["losses"]
    compare = {"steps": [len(a), len(b)], "tenths_before": tenths(a), "tenths_after": tenths(b)} if len(a) > 20 else \
        {"epochs": [len(a), len(b)], "before": a, "after": b}
    pairs = list(zip(compare.get("tenths_before", a), compare.get("tenths_after", b)))
    compare["largest_relative_difference"] = round(max(abs(x - y) / abs(x) for x, y in pairs), 4)
    for key in ("val_map", "test_auroc"):
        if key in before:
            compare[key] = [before[key], after.get(key)]
    summary[f"{model}_before_vs_after"] = compare
    print(f"{model} before vs after:", json.dumps(compare))

(out / "summary.json").write_text(json.dumps(summary, indent=1))

"""Summarise benchmarks/gpu/pytorch.sh: RetinaNet DDP scaling and mAP, FSDP2 throughput and memory, 1 vs 2 GPUs.

Usage: python benchmarks/gpu/pytorch_summary.py RESULTS_DIR   (reads the runs' JSONs there, writes summary.json)
"""
import json
import sys
from pathlib import Path

GIB = 2**30


def main(folder: Path) -> dict:
    runs = {name: json.loads((folder / f"{name}.json").read_text())
            for name in ("retinanet_1gpu", "retinanet_2gpu", "fsdp2_1gpu", "fsdp2_2gpu")}
    rn1, rn2, fs1, fs2 = runs.values()
    summary = {
        "devices": rn2["environment"]["devices"],
        "versions": rn2["environment"]["versions"],
        "date": rn2["environment"]["date"],
        "retinanet": {
            "image_size": rn2["image_size"], "batch_size_per_gpu": rn2["batch_size_per_gpu"], "bf16": rn2["bf16"],
            "images_per_s_1gpu": rn1["images_per_s"],
            "images_per_s_2gpu": rn2["images_per_s"],
            "scaling_efficiency": rn2["images_per_s"] / (2 * rn1["images_per_s"]),
            "steps_2gpu": len(rn2["losses"]),
            "loss_2gpu": [rn2["initial_loss"], rn2["final_loss"]],
            "val_map_untrained": rn2["untrained_val_map"],
            "val_map_trained": rn2["val_map"],
            "val_map_50_trained": rn2["val_map_50"],
            "eval_images": rn2["eval_images_scored"],
            "peak_memory_gib_per_gpu": {"1gpu": [b / GIB for b in rn1["peak_memory_bytes"]],
                                        "2gpu": [b / GIB for b in rn2["peak_memory_bytes"]]},
        },
        "fsdp2": {
            "num_parameters": fs2["num_parameters"], "bf16": fs2["bf16"],
            "samples_per_s_1gpu": fs1["samples_per_s"],
            "samples_per_s_2gpu": fs2["samples_per_s"],
            "scaling_efficiency": fs2["samples_per_s"] / (2 * fs1["samples_per_s"]),
            "peak_memory_gib_per_gpu": {"1gpu": [b / GIB for b in fs1["peak_memory_bytes"]],
                                        "2gpu": [b / GIB for b in fs2["peak_memory_bytes"]]},
            "sharded_state_mib_per_gpu": {"1gpu": [b / 2**20 for b in fs1["sharded_state_bytes"]],
                                          "2gpu": [b / 2**20 for b in fs2["sharded_state_bytes"]]},
            "every_param_sharded_1_over_world_2gpu": fs2["every_param_sharded_1_over_world"],
            "loss_2gpu": [fs2["initial_loss"], fs2["final_loss"]],
            "unsharded_eval_accuracy_2gpu": fs2["unsharded_eval_accuracy"],
        },
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    rn, fs = summary["retinanet"], summary["fsdp2"]
    print(f"RetinaNet DDP ({rn['image_size'][0]} px, {rn['batch_size_per_gpu']} images/GPU, bf16 {rn['bf16']}): "
          f"{rn['images_per_s_1gpu']:.0f} images/s on 1 GPU, {rn['images_per_s_2gpu']:.0f} on 2 "
          f"-> scaling efficiency {rn['scaling_efficiency']:.1%}")
    print(f"RetinaNet after {rn['steps_2gpu']} steps on 2 GPUs: val mAP {rn['val_map_trained']:.3f} "
          f"(mAP@0.5 {rn['val_map_50_trained']:.3f}) vs untrained {rn['val_map_untrained']:.3f}; "
          f"loss {rn['loss_2gpu'][0]:.3f} -> {rn['loss_2gpu'][1]:.3f}")
    print(f"FSDP2 Transformer ({fs['num_parameters'] / 1e6:.1f}M parameters, bf16 {fs['bf16']}): "
          f"{fs['samples_per_s_1gpu']:.0f} samples/s on 1 GPU, {fs['samples_per_s_2gpu']:.0f} on 2 "
          f"({fs['scaling_efficiency']:.1%}); peak memory per GPU "
          f"{fs['peak_memory_gib_per_gpu']['1gpu'][0]:.2f} GiB (1 GPU) vs "
          f"{', '.join(f'{m:.2f}' for m in fs['peak_memory_gib_per_gpu']['2gpu'])} GiB (2 GPUs); "
          f"parameter + optimizer state per GPU {fs['sharded_state_mib_per_gpu']['1gpu'][0]:.0f} MiB vs "
          f"{', '.join(f'{m:.0f}' for m in fs['sharded_state_mib_per_gpu']['2gpu'])} MiB")
    return summary


if __name__ == "__main__":
    main(Path(sys.argv[1]))

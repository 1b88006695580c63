"""The planner's command line: `python -m nbhelpers.planner MODEL --gpus N ...` prints the plan (the estimate of
every technique, the one recommended; `--json`: every term), and the time to finish with the technique recommended
(nbhelpers.planner.time_to_finish). `--help` lists the options and the known architectures.
"""
from __future__ import annotations

import argparse
import json

from nbhelpers.planner.activations import LINEAR_ATTENTION_KERNELS
from nbhelpers.planner.flops import PEAK_BF16_FLOPS
from nbhelpers.planner.parameters import LORA_ALL_LINEAR, QUANTIZATIONS, load_model
from nbhelpers.planner.plan import plan
from nbhelpers.planner.techniques import LABELS, PRECISIONS
from nbhelpers.planner.time_to_finish import FRAMEWORKS, time_to_finish, tokens_to_train

DESCRIPTION = "Will this fine-tune fit, and with which technique? A per-GPU memory planner."


def build_parser() -> argparse.ArgumentParser:
    from nbhelpers.planner import model_configs

    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass  # defaults after each flag's help; the epilog as written (names are not split at hyphens)

    known = "\n".join(f"  {name:14s} {spec.hub_id}" for name, spec in model_configs.MODELS.items())
    parser = argparse.ArgumentParser(
        prog="python -m nbhelpers.planner", description=DESCRIPTION, formatter_class=Formatter,
        epilog=f"known architectures (offline: their published configs):\n{known}\n"
               "How each term is counted: python -c 'import nbhelpers.planner.plan; help(nbhelpers.planner.plan)'")
    parser.add_argument("model", help="a known architecture (below), a hub id or a local folder with config.json")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs in all (data-parallel ranks)")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="GPUs per node, for the host memory of CPU offload; None: min(gpus, 8)")
    parser.add_argument("--gpu-memory", type=float, default=79.6,
                        help="GiB per GPU as the GPU reports it (80 GB H100: 79.6, 141 GB H200: 140.4)")
    parser.add_argument("--cpu-memory", type=float, default=None,
                        help="GiB of host memory per node, to check CPU offload; None: not checked, only stated")
    parser.add_argument("--precision", choices=PRECISIONS, default="bf16-mixed",
                        help="bf16-mixed: bf16 compute, fp32 master weights and Adam states; bf16: all 2-byte")
    parser.add_argument("--lora-rank", type=int, default=None, help="LoRA rank; None: full fine-tune")
    parser.add_argument("--lora-targets", nargs="+", default=[LORA_ALL_LINEAR],
                        help="module names LoRA adapts (last name part), or all-linear")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default=None,
                        help="QLoRA: the frozen base in bitsandbytes 4-bit (needs --lora-rank)")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--micro-batch", type=int, default=1, help="sequences per GPU per forward")
    parser.add_argument("--checkpointing", action="store_true",
                        help="activation checkpointing of every decoder layer")
    parser.add_argument("--attention", choices=("sdpa", "eager"), default=None,
                        help="attention implementation; None: what transformers picks for the model")
    parser.add_argument("--linear-attention", choices=LINEAR_ATTENTION_KERNELS, default="torch",
                        help="hybrid models (Qwen3.5): Gated DeltaNet as transformers' PyTorch fallback or "
                             "flash-linear-attention + causal-conv1d")
    parser.add_argument("--fused-adamw", action="store_true",
                        help="torch.optim.AdamW(fused=True), as the FSDP2 recipe on GPUs: no sqrt(v) step temporary")
    parser.add_argument("--chunked-loss", action="store_true",
                        help="the loss never holds the whole logits (TRL's SFTTrainer): 16 bytes a token, not 12 x vocab")
    time = parser.add_argument_group("time to finish (nbhelpers.planner.time_to_finish), with the recommended technique")
    time.add_argument("--gpu", default="H100", choices=list(PEAK_BF16_FLOPS),
                      help="the GPU: its dense bf16 peak and the speeds measured on it")
    time.add_argument("--steps", dest="max_steps", type=int, default=None,
                      help="max_steps: optimizer steps of gpus x micro-batch x accumulation sequences of seq-len tokens")
    time.add_argument("--gradient-accumulation-steps", type=int, default=1, help="micro-steps per optimizer step")
    time.add_argument("--dataset-tokens", type=int, default=None,
                      help="without --steps: the training data's tokens, trained num-train-epochs times")
    time.add_argument("--num-train-epochs", type=float, default=1, help="passes over --dataset-tokens")
    time.add_argument("--torch-compile", action=argparse.BooleanOptionalAction, default=None,
                      help="torch.compile on or off, for the nearest measured runs; unset: either")
    time.add_argument("--framework", choices=FRAMEWORKS, default=None,
                      help="what trains (pytorch: a training loop of its own, as the recipes), for the measured runs")
    time.add_argument("--price-per-gpu-hour", type=float, default=None, help="to state the cost too")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (every term, GiB per GPU)")
    return parser


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    targets = args.lora_targets[0] if args.lora_targets == [LORA_ALL_LINEAR] else args.lora_targets
    try:
        built = load_model(args.model)
        result = plan(built, gpus=args.gpus, gpu_memory_gib=args.gpu_memory, precision=args.precision,
                      lora_rank=args.lora_rank, lora_targets=targets, seq_len=args.seq_len,
                      micro_batch=args.micro_batch, checkpointing=args.checkpointing, attention=args.attention,
                      quantization=args.quantization, cpu_memory_gib=args.cpu_memory,
                      gpus_per_node=args.gpus_per_node, linear_attention=args.linear_attention,
                      fused_adamw=args.fused_adamw, chunked_loss=args.chunked_loss)
    except ValueError as error:
        parser.error(str(error))
    technique = result.recommended or result.offload
    took = technique and time_to_finish(
        built, technique, gpus=args.gpus, gpu=args.gpu, seq_len=args.seq_len, micro_batch=args.micro_batch,
        gradient_accumulation_steps=args.gradient_accumulation_steps, lora_rank=args.lora_rank,
        checkpointing=args.checkpointing, torch_compile=args.torch_compile, framework=args.framework,
        price_per_gpu_hour=args.price_per_gpu_hour,
        tokens=tokens_to_train(max_steps=args.max_steps, per_device_train_batch_size=args.micro_batch,
                               gradient_accumulation_steps=args.gradient_accumulation_steps, gpus=args.gpus,
                               seq_len=args.seq_len, dataset_tokens=args.dataset_tokens,
                               num_train_epochs=args.num_train_epochs))
    said = f"time to finish with {LABELS[technique]}: {took}" if took else "time to finish: nothing fits, so no time"
    if args.json:
        print(json.dumps({**result.to_dict(), "time_to_finish": took.to_dict() if took else None}, indent=2))
    else:
        print(f"{result}\n{said}")

"""The memory planner: will a fine-tune fit these GPUs, and with which technique (DDP, ZeRO, FSDP2, CPU offload)? And
how long will it take there?

- plan.py           the per-GPU estimate of each technique, every term derived in its docstring (`plan`)
- fits.py           the notebooks' pre-flight check: `check_fits` raises WillNotFit before the model loads
- model_configs.py  the published configs of the cookbook's models, so that planning works offline
- flops.py          FLOPs per token and the GPU's peak: model FLOPs utilisation (MFU)
- time_to_finish.py how long a run will take on N GPUs, from the MFU this cookbook measured (mfu_table.json, made
                    from benchmarks/results by benchmarks/mfu_table.py); the end of check_fits' line
- __main__.py       `python -m nbhelpers.planner qwen3-8b --gpus 2 --gpu-memory 140.4` (`--help`: the options)
"""

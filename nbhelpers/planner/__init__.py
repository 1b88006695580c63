"""The memory planner: will a fine-tune fit these GPUs, and with which technique (DDP, ZeRO, FSDP2, CPU offload)? And
how long will it take there?

- plan.py           `plan`: the per-GPU estimate of each technique, made in this order (its docstring says where each
                    term's formula stands):
- parameters.py       the model on the meta device, its parameters counted (LoRA adapters, QLoRA's 4-bit weights)
- techniques.py       what each technique keeps per GPU: parameters, gradients, optimizer states, step temporaries,
                      CPU offload's host memory
- activations.py      the bytes kept for backward per token and layer, the loss head, checkpointing, compiled layers
- verdict.py          the estimates, the technique recommended and its advice, the plan as a table
- fits.py           the notebooks' pre-flight check: `check_fits` raises WillNotFit before the model loads;
                    `fit_activations`: the cheapest way the activations fit (smaller micro-batches, checkpointing)
- model_configs.py  the published configs of the cookbook's models, so that planning works offline
- flops.py          FLOPs per token and the GPU's peak: model FLOPs utilisation (MFU)
- time_to_finish.py how long a run will take on N GPUs, from the MFU this cookbook measured (mfu_table.json, made
                    from benchmarks/results by benchmarks/mfu_table.py); the end of check_fits' line
- command_line.py   `python -m nbhelpers.planner qwen3-8b --gpus 2 --gpu-memory 140.4` (`--help`: the options;
                    __main__.py runs it)
"""

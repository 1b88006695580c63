"""What the training code of the notebooks and recipes calls: settings, rank and device, checkpoints, records.

- params.py           `read_parameters()`: a notebook's `parameters` cell (and papermill's values), checked
- runtime.py          rank, world size, device and backend (`from nbhelpers import runtime as rt`)
- checkpoints.py      checkpoints a restart can trust: sealed with checksums, verified when resumed
- metrics.py          `metrics.json`: what a run records for the tests and benchmarks, and its environment
- tracking.py         MLflow: one store for every run of the project, an experiment, a notebook's run
- hub.py              a model or dataset by name (a folder or a hub id) found before training, or one clear error
- trainer_log.py      what a Hugging Face Trainer measured: logged values, tokens/s without the warm-up steps
- step_times.py       this rank's wait for data, forward passes and steps, for the straggler report (a call per step,
                      or a callback: trainer_log.StepTimer for the HF Trainer, lightning_callback())
- adapters.py         a LoRA adapter's fingerprint (identical on every rank under DDP), the merged model's export
- needs_gpu.py        what cannot run on CPUs (the TRL notebooks) says so before anything loads
- activation_checkpointing.py  its settings by the names the installed Transformers has (renamed in 5.23)
- packing.py          GPT-OSS's attention masks for packed rows: each conversation attends only to itself
- expert_lora.py      GPT-OSS's experts' LoRA on the routed tokens, not PEFT's W + BA for every expert
- axolotl_plugins.py  Axolotl plugins: its checkpoints sealed, a resumed run on the same data order
"""

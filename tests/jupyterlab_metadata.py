"""A notebook file as JupyterLab saves it right after opening it: the metadata JupyterLab fills in from the kernel it
starts (`kernelspec` from the kernel's spec, `language_info` from its kernel_info reply), the JSON as jupyter_server
writes it (nbformat: indent 1, sorted keys). A committed notebook equal to that opens without unsaved changes.

    python tests/jupyterlab_metadata.py notebooks/pytorch/ddp_mlp.ipynb ...   # rewrite them so
"""
from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager

LANGUAGE_INFO = ("import json; from ipykernel.ipkernel import IPythonKernel; "
                 "print(json.dumps(IPythonKernel.language_info))")


@functools.lru_cache(maxsize=None)
def kernel_metadata(name: str) -> dict:
    """{kernelspec, language_info} as JupyterLab writes them for the kernel `name` (KeyError: no such kernel here)."""
    spec = KernelSpecManager().get_kernel_spec(name)
    python = spec.argv[0]
    if python in ("python", "python3"):  # jupyter_client starts the native kernel with the server's own Python
        python = sys.executable
    reply = subprocess.run([python, "-c", LANGUAGE_INFO], capture_output=True, text=True, timeout=60, check=True)
    return {"kernelspec": {"display_name": spec.display_name, "language": spec.language, "name": name},
            "language_info": json.loads(reply.stdout)}


def as_jupyterlab_saves(text: str) -> str:
    """The file JupyterLab writes when it opens `text` (a notebook's JSON) and saves it unchanged."""
    notebook = nbformat.reads(text, as_version=4)  # jupyter_server reads it so (and upgrades an older minor version)
    name = notebook.metadata.get("kernelspec", {}).get("name", "python3")
    notebook.metadata.update(kernel_metadata(name))
    written = nbformat.writes(notebook, version=nbformat.NO_CONVERT)
    return written if written.endswith("\n") else written + "\n"  # as nbformat.write ends the file


if __name__ == "__main__":
    for path in map(Path, sys.argv[1:]):
        path.write_text(as_jupyterlab_saves(path.read_text()))

"""Models and datasets by name: a local folder or a Hugging Face hub id, found before anything trains, or one error
that says where each was looked for and what to do (a gated model's licence and token included); and whether a
push to the hub can happen, checked before the run instead of after it.
"""
from __future__ import annotations

from pathlib import Path


GATED_ADVICE = ("If it is a gated model (meta-llama/..., for one), accept its licence on its page at "
                "https://huggingface.co/{name} and pass a token: `export HF_TOKEN=hf_...` before starting Jupyter "
                "(or papermill), or run `hf auth login` once.")


class NotFoundError(FileNotFoundError):
    """A model or dataset that is neither a local folder nor reachable on the Hugging Face hub."""


def find_model(model_name_or_path: str):
    """The model's config (AutoConfig), or one NotFoundError naming it, where it was looked for, and what to do.

    A local folder is used if it exists; a name that can only be a path (absolute, ./, ~/, several /) must exist;
    anything else is a hub id (fetched unless HF_HUB_OFFLINE=1, then looked up in the local cache).
    """
    from transformers import AutoConfig

    local = _local_path(model_name_or_path)
    if local is not None:
        if not (local / "config.json").is_file():
            raise NotFoundError(f"model {model_name_or_path!r}: {_missing(local, 'config.json')} (looked for on "
                                "disk only: a path is never looked up on the hub)")
        return AutoConfig.from_pretrained(local)
    try:
        return AutoConfig.from_pretrained(model_name_or_path)
    except OSError as error:
        raise NotFoundError(f"model {model_name_or_path!r} is not a folder on disk (none at "
                            f"{Path(model_name_or_path).resolve()}) and {_hub_failure(error)}. "
                            + GATED_ADVICE.format(name=model_name_or_path)) from None


def find_dataset(dataset_name: str) -> str:
    """`dataset_name` unchanged if it is an existing local path or may be a hub id; a path that cannot be found is a
    NotFoundError naming it (instead of a hub lookup of a path, or an error from inside the ranks)."""
    local = _local_path(dataset_name)
    if local is not None and not local.exists():
        raise NotFoundError(f"dataset {dataset_name!r}: {_missing(local, 'data files')} (a path is looked for on "
                            "disk only)")
    return dataset_name


def check_push_to_hub(push_to_hub: bool, hub_model_id: str) -> None:
    """Before any training: pushing needs a repository name and a token (HF_TOKEN, or `hf auth login`)."""
    if not push_to_hub:
        return
    from huggingface_hub import get_token

    if not hub_model_id or get_token() is None:
        raise ValueError("push_to_hub needs hub_model_id (e.g. 'your-name/gpt-oss-20b-multilingual') and a token with "
                         "write access: `export HF_TOKEN=hf_...` or run `hf auth login` once"
                         f" (hub_model_id={hub_model_id!r}, token {'found' if get_token() else 'not found'})")


def _local_path(name: str) -> Path | None:
    """The path `name` names on disk: an existing one, or one that cannot be a hub id; None for a (possible) hub id."""
    path = Path(name).expanduser()
    if path.exists() or path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1:
        return path
    return None


def _missing(path: Path, what: str) -> str:
    path = path.resolve()
    if not path.exists():
        return f"no such file or folder: {path}"
    return f"{path} holds no {what}"


def _hub_failure(error: OSError) -> str:
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    cause = error.__cause__ or error
    if isinstance(cause, GatedRepoError):
        return "it is gated on the hub and this token has no access to it"
    if isinstance(cause, RepositoryNotFoundError):
        return "the hub has no such repository (or it is private or gated, and no token was given)"
    if constants.HF_HUB_OFFLINE:
        return "it is not in the local hub cache, and HF_HUB_OFFLINE=1 forbids fetching it from the hub"
    return f"it could not be fetched from the hub ({str(error).splitlines()[0]})"

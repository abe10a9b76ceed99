"""Checkpoint discovery: config.json, hf_quant_config.json, safetensors shards."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vtinfer import _C
from vtinfer._fileio import check_inside, display, file_kind, index_member, read_regular
from vtinfer.hf_config import ModelGeometry


def _regular(path: Path, what: str) -> None:
    import stat

    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _C.ConfigError(f"{what} must be a regular file; got {file_kind(mode)}")


@dataclass(frozen=True)
class Checkpoint:
    """A model directory as vLLM reads it.

    Parameters
    ----------
    path : str or os.PathLike
        The directory holding ``config.json``.

    Attributes
    ----------
    config_path : Path
    hf_quant_config_path : Path or None
        Present on disk; read only when ``config.json``'s
        ``quantization_config`` is missing or null.
    shards : tuple of Path
        Safetensors files (from ``model.safetensors.index.json`` when present,
        else every ``*.safetensors`` in the folder, sorted).

    Raises
    ------
    FileNotFoundError
        No directory or no ``config.json``.
    vtinfer.ConfigError
        A malformed ``config.json`` (the file, line and column named); never a
        silent fall back to the legacy file.
    """

    path: Path
    config_path: Path
    hf_quant_config_path: Path | None
    shards: tuple[Path, ...]
    config: dict

    def __init__(self, path: str | os.PathLike) -> None:
        p = Path(path)
        if not p.is_dir():
            raise FileNotFoundError(f"Checkpoint: path must be a directory; got '{p}'")
        cfg = p / "config.json"
        if not os.path.lexists(cfg):
            raise FileNotFoundError(f"Checkpoint: {p} must contain config.json; got none")
        # only regular files inside the directory are read (vtinfer/_fileio.py)
        check_inside(cfg, p, f"Checkpoint: {cfg}")
        config = _C.json_loads(read_regular(cfg, what=f"Checkpoint: {cfg}"), display(cfg))
        if not isinstance(config, dict):
            from vtinfer import ConfigError

            raise ConfigError(f"{cfg}: config.json must hold a JSON object; got {type(config).__name__}")
        hq = p / "hf_quant_config.json"
        index = p / "model.safetensors.index.json"
        if os.path.lexists(index):
            check_inside(index, p, f"Checkpoint: {index}")
            idx = _C.json_loads(read_regular(index, what=f"Checkpoint: {index}"), display(index))
            wm = idx.get("weight_map") if isinstance(idx, dict) else None
            if not isinstance(wm, dict):
                from vtinfer import ConfigError

                raise ConfigError(f"{index}: weight_map must be a JSON object")
            # each distinct shard name checked once: an index names the same few shards for every tensor
            names = {f if isinstance(f, str) else repr(f): f for f in wm.values()}
            shards = tuple(sorted({index_member(p, f, f"Checkpoint: {index.name}: shard {f!r}")
                                   for f in names.values()}))
            for s in shards:
                if not os.path.lexists(s) or not s.exists():
                    raise FileNotFoundError(f"Checkpoint: shard {s.name} named by {index.name} is missing")
        else:
            shards = tuple(sorted(p.glob("*.safetensors")))
        for s in shards:
            check_inside(s, p, f"Checkpoint: shard {s}")
            _regular(s, f"Checkpoint: shard {s.name}")
        if os.path.lexists(hq):
            check_inside(hq, p, f"Checkpoint: {hq}")
            _regular(hq, f"Checkpoint: {hq}")
        object.__setattr__(self, "path", p)
        object.__setattr__(self, "config_path", cfg)
        object.__setattr__(self, "hf_quant_config_path", hq if hq.is_file() else None)
        object.__setattr__(self, "shards", shards)
        object.__setattr__(self, "config", config)

    @property
    def geometry(self) -> ModelGeometry:
        return ModelGeometry.from_dict(self.config, str(self.config_path))

    def quant_config_route(self) -> tuple[str | None, str]:
        """(file read, why) as get_config decides it."""
        qc = self.config.get("quantization_config")
        if qc is not None:
            return "config.json", "config.json has an inline quantization_config"
        why = "missing" if "quantization_config" not in self.config else "null"
        if self.hf_quant_config_path is not None:
            return "hf_quant_config.json", f"config.json's quantization_config is {why}; hf_quant_config.json exists"
        return None, f"config.json's quantization_config is {why} and there is no hf_quant_config.json"

    def raw(self) -> dict[str, Any]:
        return dict(self.config)

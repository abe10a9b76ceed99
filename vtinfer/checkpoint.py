"""Checkpoint discovery: config.json, hf_quant_config.json, safetensors shards."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vtinfer import _C
from vtinfer.hf_config import ModelGeometry


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
        if not cfg.is_file():
            raise FileNotFoundError(f"Checkpoint: {p} must contain config.json; got none")
        config = _C.json_loads(cfg.read_bytes(), str(cfg))
        if not isinstance(config, dict):
            from vtinfer import ConfigError

            raise ConfigError(f"{cfg}: config.json must hold a JSON object; got {type(config).__name__}")
        hq = p / "hf_quant_config.json"
        index = p / "model.safetensors.index.json"
        if index.is_file():
            idx = _C.json_loads(index.read_bytes(), str(index))
            wm = idx.get("weight_map") if isinstance(idx, dict) else None
            if not isinstance(wm, dict):
                from vtinfer import ConfigError

                raise ConfigError(f"{index}: weight_map must be a JSON object")
            shards = tuple(p / f for f in sorted(set(map(str, wm.values()))))
            for s in shards:
                if not s.is_file():
                    raise FileNotFoundError(f"Checkpoint: shard {s.name} named by {index.name} is missing")
        else:
            shards = tuple(sorted(p.glob("*.safetensors")))
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

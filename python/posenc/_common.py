"""Argument checks and the conversion of Python values to the library's text keys."""
import json
import numbers
import os

import torch

FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
INT_DTYPES = (torch.int32, torch.int64)


def check_tensor(name, t, *, positions=False, optional=False):
    """Raises TypeError/ValueError naming `name` unless t is a CPU tensor of a dtype posenc takes."""
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU tensor, got one on device '{t.device}' "
                         "(posenc's kernels run on the CPU)")
    allowed = INT_DTYPES if positions else FLOAT_DTYPES
    if t.dtype not in allowed:
        want = "int32 or int64" if positions else "float32, float64, bfloat16 or float16"
        raise TypeError(f"{name}: expected {want}, got {str(t.dtype).replace('torch.', '')}")


def check_int(name, value, *, optional=False):
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}")
    if not -2 ** 63 <= int(value) < 2 ** 63:
        raise ValueError(f"{name}: expected an integer within int64, got {int(value)}")


def check_bool(name, value):
    if value is not True and value is not False:
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")


def text(key, value):
    """A value as the library's text: booleans true/false, numbers, strings, lists comma-separated."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))
    if isinstance(value, str):
        return value
    if isinstance(value, torch.Tensor):
        return ",".join(repr(float(x)) for x in value.detach().reshape(-1).tolist())
    if isinstance(value, (list, tuple)):
        return ",".join(text(key, x) for x in value)
    raise TypeError(f"{key}: expected a number, bool, string or list, got {type(value).__name__}")


def key(name):
    """The vocabulary's spelling of a key: '-' read as '_'."""
    return name.replace("-", "_")


def config_text(config):
    """config.json's text from a dict or a path."""
    if isinstance(config, dict):
        try:
            return json.dumps(config, allow_nan=False)
        except ValueError:
            raise ValueError("config: expected finite numbers (JSON has no NaN or infinity)") from None
    if isinstance(config, (str, os.PathLike)):
        try:
            with open(config, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise ValueError(f"config: cannot read {os.fspath(config)}: {e.strerror}") from None
    raise TypeError(f"config: expected a dict or the path of a config.json, got {type(config).__name__}")

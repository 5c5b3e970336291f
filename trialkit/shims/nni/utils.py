"""The helpers of NNI 3.0's nni.utils that trial code imports (merge_parameter above all)."""
from enum import Enum
from typing import Any, Mapping, Optional


class OptimizeMode(Enum):
    Minimize = "minimize"
    Maximize = "maximize"


def merge_parameter(base_params: Any, override_params: Optional[Mapping[str, Any]]) -> Any:
    """Update `base_params` (a dict or an argparse namespace) in place with the tuner's
    parameters and return it, as NNI does: a key it lacks is a ValueError, and so is a
    value of another type than the base's (an int for a float base is made a float)."""
    if override_params is None:
        return base_params
    is_dict = isinstance(base_params, dict)
    for key, value in override_params.items():
        has = key in base_params if is_dict else hasattr(base_params, key)
        if not has:
            raise ValueError(f"Key '{key}' not found in base parameters.")
        base = base_params[key] if is_dict else getattr(base_params, key)
        value = _compatible(key, base, value)
        if is_dict:
            base_params[key] = value
        else:
            setattr(base_params, key, value)
    return base_params


def _compatible(key: str, base: Any, override: Any) -> Any:
    if base is None or isinstance(override, type(base)):
        return override
    if isinstance(base, float) and isinstance(override, int):
        return float(override)
    raise ValueError(f'Expected "{key}" in override parameters to have type {type(base).__name__}, '
                     f"but found {type(override).__name__}")


def extract_scalar_reward(value: Any, scalar_key: str = "default") -> float:
    """The number a metric stands for: itself, or its dict's `scalar_key` (NNI's rule)."""
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, dict) and scalar_key in value and isinstance(value[scalar_key], (int, float)):
        return value[scalar_key]
    raise RuntimeError(f'Incorrect final result: the final result should be float/int, or a dict which has a '
                       f'key named "{scalar_key}" whose value is float/int.')

"""Op schemas, registered by (domain, op type, first version), as ONNX versions its operators.

Adding an op is one entry in the module of its family: a line for the elementwise ones (planner/ops/
math_ops.py), a class with `@schema("OpType")` for the others; a new family is a new module here. A schema
for a newer version of an op is another one registered with `since=` its first opset. Domains: "" (ONNX's
default), "memplan" (memplan's own ops: optimizers, the training-mode Dropout). The registry is
planner/ops/registry.py; this package imports every module of its folder, so that importing it registers
every family, and hands the registry on.
"""
import pkgutil
from importlib import import_module

from .base import Info, Layout, Schema, Slice
from .refused import REASONS
from .registry import SCHEMAS, check_supported, get, known, node_flops, of, register, schema

for _family in pkgutil.iter_modules(__path__):  # every family registers its ops when imported
    import_module(f"{__name__}.{_family.name}")

__all__ = ["SCHEMAS", "REASONS", "register", "schema", "get", "of", "known", "check_supported", "node_flops", "Info", "Layout",
           "Schema", "Slice"]

"""Typed configs: YAML files plus ``key=value`` overrides, unknown keys are errors.

Every command's options are a pydantic model deriving from :class:`Config`. Values come,
in increasing priority, from the model's defaults, a YAML file, and ``key=value`` (or
``a.b=value`` for nested models) overrides on the command line. An unknown key is a
one-line :class:`~turnrl.errors.TurnRLError` that names it and the closest valid key.
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from turnrl.errors import TurnRLError, did_you_mean

C = TypeVar("C", bound="Config")


class Range(NamedTuple):
    """The allowed values of a number: finite, from ``lo`` (to ``hi``), each end open or closed."""

    lo: float
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def check(self, v: Any) -> Any:
        """``v`` when allowed, else a ValueError that pydantic reports with the key and where it
        was set: ``must be >= 1``, ``must be a finite number >= 0``, ``must be in (0, 1]``."""
        above = v > self.lo if self.lo_open else v >= self.lo
        below = self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)
        if (not isinstance(v, float) or math.isfinite(v)) and above and below:  # an int of any size is finite
            return v
        if self.hi is None:
            what = "a finite number " if isinstance(v, float) else ""
            raise ValueError(f"must be {what}{'>' if self.lo_open else '>='} {_bound(self.lo)}")
        raise ValueError(f"must be in {'(' if self.lo_open else '['}{_bound(self.lo)}, {_bound(self.hi)}"
                         f"{')' if self.hi_open else ']'}")


def _bound(x: float) -> str:
    """A range's end as written: ``0.5``, ``1e-05``, and a large whole number in full (2147483647)."""
    return str(int(x)) if float(x).is_integer() and abs(x) >= 1e6 else f"{x:g}"


#: the seeds a config takes: numpy's and torch's generators refuse negative and very large ones
SEED_MAX = 2**31 - 1
SEED_RANGE = Range(0, SEED_MAX)


class Config(BaseModel):
    """Base of every config: unknown keys are rejected, assignments are validated, and the
    numbers named in ``value_ranges`` are checked (None passes: an optional setting unset)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())
    #: field name -> allowed values; a subclass extends its parent's (``{**Parent.value_ranges, ...}``)
    value_ranges: ClassVar[dict[str, Range]] = {}

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, v: Any, info: ValidationInfo) -> Any:
        """pydantic reads ``true`` as 1 for an int or float setting (``batch_size=true``, YAML's
        ``lr: on``): a boolean given for a number is an error instead."""
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _bool_for_a_number(field.annotation, v):
            raise ValueError("must be a number, not a boolean")
        if info.field_name == "instruction" and isinstance(v, str) and not v.strip():
            # an unset instruction is the env's own: an empty one given (``instruction=``) would
            # silently be read as unset
            raise ValueError("empty; leave it out to use the env's instruction")
        return v

    @field_validator("*")
    @classmethod
    def _in_range(cls, v: Any, info: ValidationInfo) -> Any:
        name = info.field_name or ""
        allowed = cls.value_ranges.get(name)
        if allowed is None and (name == "seed" or name.endswith("_seed") or name == "seeds"):
            allowed = SEED_RANGE  # every seed: numpy and torch take no negative or 64-bit one
        if allowed is None or v is None:
            return v
        if isinstance(v, list):
            return [allowed.check(x) for x in v]
        return allowed.check(v) if isinstance(v, int | float) else v


_NUMBERS = (int, float)


def _bool_for_a_number(annotation: Any, value: Any) -> bool:
    """True when ``value`` is (or holds, in a list, tuple or dict's values) a bool where
    ``annotation`` takes a number and no bool (``int``, ``float | None``, ``list[int]``)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _bool_for_a_number(args[0], value)
    if origin is typing.Union or origin is types.UnionType:
        members = [typing.get_origin(a) or a for a in args]
        if isinstance(value, bool):
            return any(m in _NUMBERS for m in members) and not any(m in (bool, Any, object) for m in members)
        return any(_bool_for_a_number(a, value) for a in args if typing.get_origin(a) is not None)
    if isinstance(value, bool):
        return annotation in _NUMBERS
    if isinstance(value, list | tuple) and origin in (list, tuple, Sequence) and args:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return any(_bool_for_a_number(a, x) for a, x in zip(args, value, strict=False))
        return any(_bool_for_a_number(args[0], x) for x in value)
    if isinstance(value, dict) and origin is dict and len(args) == 2:
        return any(_bool_for_a_number(args[1], x) for x in value.values())
    return False


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader (YAML 1.1), but a number in exponent notation is a float with or
    without a dot and a sign (``1e-5``, ``2e4``, ``1.0e5``), as in YAML 1.2, JSON and Python:
    YAML 1.1 reads those as strings, which a ``dict`` / ``Any`` setting (``env_opts``) keeps; and
    integers are YAML 1.2's (``seed: 010`` is 10, not octal 8; ``1:30`` is not 90)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?|[-+]?\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)
# integers as YAML 1.2 reads them: ``010`` is 10 (YAML 1.1: octal 8), ``1:30`` is text (YAML 1.1: 90, base
# 60); ``0x1f``, ``0o17`` and ``0b101`` (YAML 1.1's, kept) are hexadecimal, octal and binary, as in Python
_INT = "tag:yaml.org,2002:int"
_Loader.yaml_implicit_resolvers = {ch: [(tag, rx) for tag, rx in rs if tag != _INT]
                                   for ch, rs in _Loader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_INT, re.compile(r"^[-+]?(?:[0-9][0-9_]*|0x[0-9a-fA-F_]+|0o[0-7_]+|0b[01_]+)$"),
                              list("-+0123456789"))


def _yaml12_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node)).replace("_", "")
    sign, digits = (-1, text[1:]) if text[:1] == "-" else (1, text.lstrip("+"))
    return sign * (int(digits, 0) if digits[:2] in ("0x", "0o", "0b") else int(digits, 10))


_Loader.add_constructor(_INT, _yaml12_int)


def parse_value(text: str) -> Any:
    """Parse an override's value as YAML (``3`` -> int, ``true`` -> bool, ``[1,2]`` -> list,
    ``{a: 1}`` -> dict, ``'a: b'`` -> str). Prose that YAML would read otherwise stays the text it
    is: a block mapping (``Hint: be brief``), a block list (``- be brief``), a comment
    (``pick #1``); on the command line a mapping is written in braces and a list in brackets."""
    if text == "":
        return ""
    try:
        value = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError:
        return text
    head = text.strip()[:1]
    if isinstance(value, dict) and head != "{" or isinstance(value, list) and head != "[":
        return text
    if head not in ("'", '"') and re.search(r"(^|\s)#", text):
        return text  # YAML would drop the rest as a comment
    return value


def _split_override(item: str) -> tuple[str, str]:
    """``"a.b = 3"`` -> ``("a.b", " 3")``: the dotted key, stripped, and the raw value."""
    key, value = item.split("=", 1)
    return key.strip(), value


def parse_overrides(items: list[str] | None, what: str = "override") -> dict[str, Any]:
    """Turn ``["a=1", "b.c=x"]`` into a nested dict; a malformed item is a one-line error."""
    out: dict[str, Any] = {}
    by: dict[str, str] = {}  # the item that set each dotted key, as a value or as a section
    for item in items or []:
        if "=" not in item:
            raise TurnRLError(f"bad {what} '{item}': expected key=value")
        key, value = _split_override(item)
        if not key:
            raise TurnRLError(f"bad {what} '{item}': empty key")
        node = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):  # e.g. lora=null then lora.r=4
                raise TurnRLError(f"bad {what} '{item}': '{'.'.join(parts[:i + 1])}' is set to a value by "
                                  f"'{_setter(by, parts[:i + 1])}'; give the section or the value, not both")
            by.setdefault(".".join(parts[:i + 1]), item)
        if isinstance(node.get(parts[-1]), dict):  # e.g. lora.r=4 then lora=null: r would be dropped
            raise TurnRLError(f"bad {what} '{item}': '{key}' is a section that '{_setter(by, parts)}' sets; "
                              "give the section or the value, not both")
        node[parts[-1]] = parse_value(value)
        by[key] = item
    return out


def _setter(by: dict[str, str], parts: list[str]) -> str:
    """The override that set the dotted key ``parts``, or the section above it (``a={b: 1}`` sets ``a.b``)."""
    return next(by[k] for i in range(len(parts), 0, -1) if (k := ".".join(parts[:i])) in by)


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _with_defaults(cls: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with each section that sets some keys of a field whose default is a model filled
    in from that default: ``sft.lr=1e-3`` keeps the rest of the pipeline's own default ``sft``
    settings instead of falling back to ``SFTConfig``'s class defaults."""
    out = dict(data)
    for key, value in data.items():
        field = cls.model_fields.get(key) if isinstance(key, str) else None
        if field is None or not isinstance(value, dict):
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            out[key] = _fill(default, value)
    return out


def _fill(default: BaseModel, value: dict[str, Any]) -> dict[str, Any]:
    """``value`` (a section's given keys) completed from ``default``: a key it leaves out takes the
    default's value, a nested model section is completed the same way, and any other value given
    (a free-form ``env_opts`` dict included) replaces the default's whole, so that ``env: bandit``
    with its own ``env_opts`` does not inherit tic-tac-toe's."""
    # a section class whose defaults depend on a given key (a pipeline's ``env``: another env takes its own
    # prompt and options) sets them from the given keys first, as its validator does for a whole config
    env_defaults = getattr(type(default), "_env_defaults", None)
    if env_defaults is not None:
        value = env_defaults(dict(value))
    dumped = default.model_dump()
    out = {k: v for k, v in dumped.items() if k not in value}
    for key, v in value.items():
        sub = getattr(default, key, None) if isinstance(key, str) and key in type(default).model_fields else None
        out[key] = _fill(sub, v) if isinstance(sub, BaseModel) and isinstance(v, dict) else v
    return out


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The model class a field holds: its annotation, or the model member of an optional or union
    one (``LoraSettings | None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    members = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return members[0] if len(members) == 1 else None


def _fields_at(cls: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Valid field names of the (nested) model at ``loc``'s parent, for suggestions."""
    model: Any = cls
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        model = _section_model(getattr(field, "annotation", None))
        if model is None:
            return []
    return list(model.model_fields)


def _key_of(cls: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """``loc`` as the dotted key a user writes: the parts pydantic adds to name the member of a union
    it tried (``lora.target_modules.list[str]``, ``lora.LoraSettings.r``) are left out."""
    model: Any = cls
    parts: list[str] = []
    tags: set[str] = set()
    for part in loc:
        if isinstance(part, str) and part in tags and (model is None or part not in model.model_fields):
            continue  # the union member pydantic tried: no key of the user's
        parts.append(str(part))
        field = model.model_fields.get(part) if model is not None and isinstance(part, str) else None
        annotation = getattr(field, "annotation", None)
        members = typing.get_args(annotation) if field is not None else ()
        tags = {getattr(a, "__name__", "") if isinstance(a, type) and issubclass(a, BaseModel) else
                str(a).replace("typing.", "") for a in members} | {"none", "None"}
        tags |= {t.lower() for t in tags}
        model = _section_model(annotation)
    return ".".join(parts) or "<root>"


def format_validation_error(cls: type[BaseModel], err: ValidationError, source: str) -> str:
    """One line naming the first bad key, with a suggestion for unknown keys."""
    first = err.errors()[0]
    loc = tuple(first.get("loc", ()))
    key = _key_of(cls, loc)
    if first.get("type") == "extra_forbidden":
        fields = _fields_at(cls, loc) if loc else []
        given = first.get("input")
        if len(loc) == 1 and isinstance(given, dict) and given and all(k in fields for k in given):  # ppo.gamma=2
            hint = f" (this config is flat: write {', '.join(repr(str(k)) for k in given)} without '{loc[-1]}.')"
        else:
            hint = did_you_mean(str(loc[-1]), fields) if loc else ""
        return f"{source}: unknown key '{key}'{hint}"
    msg = str(first.get("msg")).removeprefix("Value error, ")
    return f"{source}: bad value for '{key}': {msg} (got {first.get('input')!r})"


def _yaml_line(text: str, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest key of ``loc`` present in the YAML ``text`` (None if none)."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            hit = next(((k, v) for k, v in node.value if getattr(k, "value", None) == str(part)), None)
            if hit is None:
                break
            line, node = hit[0].start_mark.line + 1, hit[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _error_source(loc: tuple[Any, ...], overrides: list[str], path: Path | None, text: str) -> str:
    """Where the bad key of ``loc`` was set: the override naming it, else the file and line."""
    parts = [str(p) for p in loc]
    for n in range(len(parts), 0, -1):  # the override of the key itself or of a section above it
        dotted = ".".join(parts[:n])
        for item in reversed(overrides):
            key = _split_override(item)[0]
            # an unknown section ('ppo' of 'ppo.gamma=2') was set by an override below it
            if key == dotted or n == len(parts) and key.startswith(dotted + "."):
                return f"override '{item}'"
    if path is None:
        return "config"
    line = _yaml_line(text, loc)
    return f"{path}:{line}" if line is not None else str(path)


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int):
        super().__init__(key)
        self.key, self.line = key, line


class _UniqueKeyLoader(_Loader):
    """:class:`_Loader`, but a key set twice in one mapping is an error (PyYAML keeps the
    last value silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<: *anchor': its keys are merged below (a key set here overrides them)
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # a list or mapping as a key: PyYAML's own error ("found unhashable key")
            if key in seen:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        self.flatten_mapping(node)  # merge keys ('<<: *anchor') become the anchored mapping's keys
        return super().construct_mapping(node, deep=deep)


def load_config(
    cls: type[C],
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> C:
    """Build ``cls`` from defaults < ``base`` < YAML file ``path`` < ``overrides``.

    A bad key or value is a one-line error naming where it was set: the override
    (``override 'train.lr=x'``) or the file and line (``configs/c.yaml:12``).
    """
    data: dict[str, Any] = dict(base or {})
    p = Path(path) if path is not None else None
    text = ""
    if p is not None:
        if not p.is_file():
            raise TurnRLError(f"{p}: {'is a folder, not a config file' if p.is_dir() else 'config file not found'}")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise TurnRLError(f"{p}: not a UTF-8 text file (byte {e.start + 1}); a config is YAML text") from None
        except OSError as e:
            raise TurnRLError(f"{p}: cannot read the config file ({e.strerror or e})") from None
        try:
            loaded = yaml.load(text, Loader=_UniqueKeyLoader) or {}
        except _DuplicateKey as e:
            raise TurnRLError(f"{p}:{e.line}: key '{e.key}' is set twice (the first value would be lost)") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
            raise TurnRLError(f"{where}: invalid YAML: {getattr(e, 'problem', e)}") from None
        if not isinstance(loaded, dict):
            raise TurnRLError(f"{p}: expected a mapping of keys to values at the top level")
        data = merge(data, loaded)
    extra = parse_overrides(overrides)
    if extra:
        data = merge(data, extra)
    try:
        return cls.model_validate(_with_defaults(cls, data))
    except ValidationError as e:
        loc = tuple(e.errors()[0].get("loc", ()))
        source = _error_source(loc, overrides or [], p, text)
        raise TurnRLError(format_validation_error(cls, e, source)) from None

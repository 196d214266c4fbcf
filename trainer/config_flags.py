"""Command-line flags derived from config dataclasses, so a training setting is declared once:
as a field of its config (`SFTConfig`, `PPOConfig`, `RecipeConfig`, `FlywheelConfig`), with its
help text in the field's metadata, its check in the config's `validate()`.

    knob(0.5, "reward subtracted for ...")                 # flag --format-penalty (the field's name)
    knob(8, "episodes per update", flag="batch")           # flag --batch
    nested(lambda: PPOConfig(lr=1e-4), prefix="ppo-", bare=("updates",))   # --ppo-lr, --updates

`add_flags(parser, Config)` adds one argparse argument per field (type, choices, default and help
from the field; a bool is a --x / --no-x switch; an optional value also takes "none"; a list is
comma-separated); `from_args(Config, args)` builds the config back; `to_argv(cfg)` writes the flags
that rebuild `cfg` (what `from_args` of their parse gives back, a test checks it);
`from_dict(Config, d)` loads a saved config, nested or in the older flat form (`legacy` keys).

A nested config's own fields get `prefix` before their flag, except those in `bare` (the flag as
the nested config has it) and `renamed` ({field: flag}); `skip` fields are not the parent's
settings (no flag; validate_nested refuses a changed one), and `tied` ones are set from the
parent's field of the same name (its seed, say)."""
from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
from dataclasses import MISSING, field, fields, is_dataclass, replace

from trainer.errors import TrainerError


class ConfigError(TrainerError, ValueError):
    """A setting that cannot work. `field` is its dotted name ("ppo.clip_high"); the command
    line says it with the flag instead (describe)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field} {message}")
        self.field, self.message = field, message

    def under(self, name: str) -> ConfigError:
        """The same error named from the parent that holds this config as its field `name`."""
        return ConfigError(f"{name}.{self.field.split('.', 1)[-1]}", self.message)


def check(ok: bool, field: str, message: str, value=None) -> None:
    """Raise ConfigError("<field> <message>, got <value>") unless ok."""
    if not ok:
        raise ConfigError(field, f"{message}, got {value!r}")


def check_choices(cfg) -> None:
    """Each field declared with choices holds one of them."""
    name = getattr(cfg, "NAME", type(cfg).__name__)
    for f in fields(cfg):
        ch = f.metadata.get("choices")
        if ch:
            check(getattr(cfg, f.name) in ch, f"{name}.{f.name}", f"must be one of {', '.join(ch)}", getattr(cfg, f.name))


def knob(default=MISSING, help: str = "", *, factory=MISSING, flag: str | None = None, choices=None,
         metavar: str | None = None, cli: bool = True):
    """A config field with its command-line metadata: help, the flag's name when it is not the
    field's (without the leading --), choices, metavar; cli=False: no flag (a dict of settings)."""
    md = {"help": help, "flag": flag, "choices": tuple(choices) if choices else None, "metavar": metavar, "cli": cli}
    return field(default=default, default_factory=factory, metadata=md)


def nested(factory, help: str = "", *, prefix: str, bare=(), renamed=None, helps=None, skip=(), tied=()):
    """A field holding another config (made by `factory`, the parent's defaults for it); `helps`:
    {field: help} where the parent means more by a field than the nested config says."""
    md = {"help": help, "nested": True, "prefix": prefix, "bare": tuple(bare), "renamed": dict(renamed or {}),
          "helps": dict(helps or {}), "skip": tuple(skip), "tied": tuple(tied)}
    return field(default_factory=factory, metadata=md)


@functools.cache
def _hints(cls) -> dict:
    """The class's annotations, resolved (they are strings under `from __future__ import annotations`)."""
    return typing.get_type_hints(cls)


def _kind(cls, f) -> tuple[type, bool, bool]:
    """(value type, optional, list) of a field, from its annotation."""
    t = _hints(cls)[f.name]
    optional = False
    if isinstance(t, types.UnionType) or typing.get_origin(t) is typing.Union:
        args = [a for a in typing.get_args(t) if a is not type(None)]
        optional, t = len(args) < len(typing.get_args(t)), args[0]
    if typing.get_origin(t) is list:
        return typing.get_args(t)[0], optional, True
    return t, optional, False


@dataclasses.dataclass
class Flag:
    path: str  # the field's dotted name from the config given to add_flags ("ppo.lr")
    flag: str  # "--ppo-lr"
    cls: type  # the config class that declares the field
    f: dataclasses.Field
    help: str


def flags_of(cls, *, _parent: dict | None = None, _path: str = "") -> list[Flag]:
    """Every field of `cls` that is a flag, nested configs' fields included, in field order."""
    out = []
    for f in fields(cls):
        md = f.metadata
        if md.get("nested"):
            sub_cls = _hints(cls)[f.name]
            out += flags_of(sub_cls, _parent=md, _path=f"{_path}{f.name}.")
            continue
        if not md.get("cli", True):
            continue
        own = md.get("flag") or f.name.replace("_", "-")
        name, help_ = f"--{own}", md.get("help") or ""
        if _parent is not None:
            help_ = _parent["helps"].get(f.name, help_)
            if f.name in _parent["skip"] or f.name in _parent["tied"]:
                continue
            if f.name in _parent["renamed"]:
                name = _parent["renamed"][f.name]
            elif f.name not in _parent["bare"]:
                name = f"--{_parent['prefix']}{own}"
        out.append(Flag(_path + f.name, name, cls, f, help_))
    return out


def _get(cfg, path: str):
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _parser_type(base: type, optional: bool, is_list: bool):
    def parse(text: str):
        if optional and text.lower() == "none":
            return None
        if is_list:
            return [s.strip() for s in text.split(",") if s.strip()]
        return base(text)

    parse.__name__ = base.__name__  # argparse names the type in "invalid int value"
    return parse


def _default(cls, path: str):
    """A field's default, read from the declarations (the whole config is not made: a parser is
    built on every start, and a recipe's or flywheel's checks import the sandbox)."""
    head, _, rest = path.partition(".")
    f = next(f for f in fields(cls) if f.name == head)
    value = f.default if f.default is not MISSING else f.default_factory()
    return _get(value, rest) if rest else value


def add_flags(parser, cls, *, base=None, keep: bool = False, exclude=()) -> None:
    """One argument per flag of `cls`, defaults from `base` (default: the fields' defaults).
    keep=True: every default is None, so what was not given leaves a loaded config alone
    (overrides())."""
    for fl in flags_of(cls):
        if fl.path in exclude:
            continue
        t, optional, is_list = _kind(fl.cls, fl.f)
        default = _default(cls, fl.path) if base is None else _get(base, fl.path)
        md, help_ = fl.f.metadata, fl.help
        shown = ",".join(default) if is_list and default else default
        said = t is bool or default is None or "default" in help_  # a switch says its default itself
        kw = {"dest": fl.path, "default": None if keep else default,
              "help": help_ if said else f"{help_} (default {shown})".strip()}
        if t is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = _parser_type(t, optional, is_list)
            if md.get("choices"):
                kw["choices"] = md["choices"]
            if not md.get("choices"):
                kw["metavar"] = md.get("metavar") or fl.flag.lstrip("-").upper().replace("-", "_")
        parser.add_argument(fl.flag, **kw)


def overrides(cls, args) -> dict:
    """{dotted field: value} of the flags given on the command line (after add_flags(keep=True))."""
    return {fl.path: getattr(args, fl.path) for fl in flags_of(cls)
            if getattr(args, fl.path, None) is not None}


def with_values(cfg, values: dict):
    """`cfg` with dotted-field values replaced (nested configs rebuilt, so each validates)."""
    top, inner = {}, {}
    for path, v in values.items():
        head, _, rest = path.partition(".")
        if rest:
            inner.setdefault(head, {})[rest] = v
        else:
            top[head] = v
    for head, sub in inner.items():
        try:
            top[head] = with_values(getattr(cfg, head), sub)
        except ConfigError as e:
            raise e.under(head) from None
    return replace(cfg, **top)


def from_args(cls, args, *, base=None):
    """The config that add_flags(parser, cls, base=base)'s parse asks for."""
    base = cls() if base is None else base
    return with_values(base, {fl.path: getattr(args, fl.path) for fl in flags_of(cls) if hasattr(args, fl.path)})


def _text(v) -> str:
    if isinstance(v, list):
        return ",".join(v)
    if isinstance(v, float):  # short where that is exact, else every digit: the parse must give v back
        return format(v, "g") if float(format(v, "g")) == v else repr(v)
    return "none" if v is None else str(v)


def to_argv(cfg, *, base=None) -> list[str]:
    """The flags, in field order, that turn `base` (default: a default config) into `cfg`."""
    base = type(cfg)() if base is None else base
    argv = []
    for fl in flags_of(type(cfg)):
        v = _get(cfg, fl.path)
        if v == _get(base, fl.path):
            continue
        if isinstance(v, bool):
            argv.append(fl.flag if v else f"--no-{fl.flag[2:]}")
        else:
            argv += [fl.flag, _text(v)]
    return argv


def describe(e: ConfigError, cls) -> str:
    """The error as the command line says it: its flag instead of the field's name."""
    root = getattr(cls, "NAME", "")
    for fl in flags_of(cls):
        if e.field in (fl.path, f"{root}.{fl.path}"):
            return f"{fl.flag} {e.message}"
    return str(e)


def validate_nested(cfg) -> None:
    """Each nested config's `skip` fields at the parent's defaults (they are not its settings).
    Nested configs validate themselves when made; this checks what only the parent knows."""
    for f in fields(cfg):
        if not f.metadata.get("nested"):
            continue
        mine, theirs = getattr(cfg, f.name), f.default_factory()
        for name in f.metadata["skip"]:
            check(getattr(mine, name) == getattr(theirs, name), f"{f.name}.{name}",
                  f"is not a setting of {type(cfg).__name__} (keep {getattr(theirs, name)!r})", getattr(mine, name))


def tie(cfg) -> None:
    """Set each nested config's `tied` fields from the parent's field of the same name."""
    for f in fields(cfg):
        if f.metadata.get("nested") and f.metadata["tied"]:
            sub = getattr(cfg, f.name)
            want = {k: getattr(cfg, k) for k in f.metadata["tied"]}
            if any(getattr(sub, k) != v for k, v in want.items()):
                object.__setattr__(cfg, f.name, replace(sub, **want))


def dotted(cls, d: dict, *, legacy: dict | None = None) -> tuple[dict, list[str]]:
    """({dotted field: value}, unknown keys) of a saved config dict: nested configs as dicts, or
    (configs saved before they nested) flat keys: `legacy` maps an old key to its dotted field
    (or a tuple of them), and "<nested name>_<field>" finds a nested field by itself."""
    legacy = legacy or {}
    hints = _hints(cls)
    subs = {f.name: {g.name for g in fields(hints[f.name])} for f in fields(cls) if f.metadata.get("nested")}
    own = {f.name for f in fields(cls)}
    values, unknown = {}, []
    for k, v in d.items():
        if k in subs and isinstance(v, dict):
            paths = [f"{k}.{sk}" for sk in v]
            v = list(v.values())
        else:
            if k in own:
                paths = [k]
            elif k in legacy:
                paths = [legacy[k]] if isinstance(legacy[k], str) else list(legacy[k])
            else:
                head, _, rest = k.partition("_")
                paths = [f"{head}.{rest}"] if head in subs and rest else []
            v = [v] * len(paths)
            if not paths:
                unknown.append(k)
        for path, value in zip(paths, v, strict=True):
            head, _, rest = path.partition(".")
            if rest and rest not in subs.get(head, ()):
                unknown.append(path if k in subs else k)
            else:
                values[path] = value
    return values, unknown


def from_dict(cls, d: dict, *, legacy: dict | None = None):
    """A config from a saved dict (see dotted); an unknown key is refused, named."""
    values, unknown = dotted(cls, d, legacy=legacy)
    if unknown:
        raise ConfigError(getattr(cls, "NAME", cls.__name__), f"config: unknown setting(s) {', '.join(sorted(unknown))}")
    return with_values(cls(), values)


def flatten(cfg) -> dict:
    """{dotted field: value} of a config, nested configs' fields included."""
    out = {}
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if is_dataclass(v):
            out |= {f"{f.name}.{k}": x for k, x in flatten(v).items()}
        else:
            out[f.name] = v
    return out

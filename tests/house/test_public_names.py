"""Where each public name lives: the table in `src/boxwood/README.md` is the
contract. Every public name of `boxwood`, `boxwood.nn`, `boxwood.models`,
`boxwood.debug`, `boxwood.internal` and `boxwood.random` is in it once, and the
file it names defines the name (at its top level, under the name the namespace
imports, and as the object's own module or code says)."""

import __future__

import ast
import importlib
import inspect
import pathlib
import re
import types

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "boxwood"
SECTION = "## Where each public name lives"
# the prefix of a name in the table -> the namespace that holds it
NAMESPACES = {
    "": "boxwood",
    "nn.": "boxwood.nn",
    "models.": "boxwood.models",
    "debug.": "boxwood.debug",
    "internal.": "boxwood.internal",
    "random.": "boxwood.random",
}
_ROW = re.compile(r"\| `([\w/]+\.py)` \| (.+) \|$")


def table(text: str) -> dict[str, str]:
    """The README's table as `{public name: file under src/boxwood}`; a name
    listed twice is an error."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    homes: dict[str, str] = {}
    for line in section.splitlines():
        if match := _ROW.match(line):
            for name in re.findall(r"`([\w.]+)`", match.group(2)):
                assert name not in homes, f"`{name}` is listed twice"
                homes[name] = match.group(1)
    return homes


def public_names() -> dict[str, object]:
    """Every public name of the namespaces, as the table writes it."""
    found = {}
    for prefix, module in NAMESPACES.items():
        for name, obj in vars(importlib.import_module(module)).items():
            if name.startswith("_") or isinstance(
                obj, types.ModuleType | __future__._Feature
            ):
                continue
            found[prefix + name] = obj
    return found


def imported_as(module: str) -> dict[str, str]:
    """`{public name: the name its file defines}` for the names a namespace's
    `__init__.py` imports under another name (`from ..debug import backward_nan
    as debug_backward_nan`)."""
    file = pathlib.Path(str(importlib.import_module(module).__file__))
    found = {}
    for node in ast.parse(file.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.asname and alias.asname != alias.name:
                    found[alias.asname] = alias.name
    return found


def _top_level(body: list[ast.stmt]):
    """The statements of a module's top level, those under `if` and `try` too."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            for part in (node.body, node.orelse, getattr(node, "finalbody", [])):
                yield from _top_level(part)


def _defines(path: pathlib.Path, name: str) -> bool:
    """Whether the file binds `name` at its top level (`def`, `class` or an
    assignment)."""
    for node in _top_level(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def _home(obj: object) -> str | None:
    """The file under src/boxwood that the object says defines it: a function's
    code (under any wrapper that keeps `__wrapped__`), or a class's module (an
    instance's class's). `None` where the module is a public namespace (a class
    that shows its public name in tracebacks)."""
    target = inspect.unwrap(obj) if callable(obj) else obj  # type: ignore[arg-type]
    code = getattr(target, "__code__", None)
    if code is not None:
        return _under_package(code.co_filename)
    cls = target if isinstance(target, type) else type(target)
    if cls.__module__ in NAMESPACES.values():
        return None
    return _under_package(
        getattr(importlib.import_module(cls.__module__), "__file__", None)
    )


def _under_package(file: str | None) -> str | None:
    """`file` relative to src/boxwood, or `None` for a file outside it (the class of
    an instance from JAX or Python, such as a `Primitive` or a `dict`: the table's
    file is then checked only to bind the name)."""
    path = pathlib.Path(file or "").resolve()
    if not path.is_relative_to(PACKAGE):
        return None
    return path.relative_to(PACKAGE).as_posix()


def mismatches(homes: dict[str, str], names: dict[str, object]) -> list[str]:
    """What is wrong with `homes` for these public names."""
    found = [f"not in the table: {n}" for n in sorted(set(names) - set(homes))]
    found += [f"not public: {n}" for n in sorted(set(homes) - set(names))]
    renamed = {
        prefix + public: defined
        for prefix, module in NAMESPACES.items()
        for public, defined in imported_as(module).items()
    }
    for name in sorted(set(homes) & set(names)):
        file = homes[name]
        defined = renamed.get(name, name.rsplit(".", 1)[-1])
        if not _defines(PACKAGE / file, defined):
            found.append(f"{file} does not define {name}")
        elif (home := _home(names[name])) not in (None, file):
            found.append(f"{name} is defined in {home}, not {file}")
    return found


def test_each_public_name_is_where_the_table_says():
    homes = table((PACKAGE / "README.md").read_text(encoding="utf-8"))
    assert mismatches(homes, public_names()) == []


def test_the_table_check_finds_a_wrong_row():
    text = (
        f"{SECTION}\n\n| file | names |\n|---|---|\n"
        "| `_transforms/_jvp.py` | `filter_grad`, `filter_jvp` |\n"
        "| `_tree.py` | `tree_at`, `not_a_name` |\n"
        "| `_errors.py` | `error_if` |\n"
        "| `debug/_backward_nan.py` | `internal.debug_backward_nan` |\n"
        "| `debug/_dce.py` | `internal.store_dce`, `debug.backward_nan` |\n"
        "| `internal/_misc.py` | `internal.noinline_p` |\n"
        "| `internal/_noinline.py` | `internal.nontraceable_p` |\n"
        "\n## Next section\n| `_tree.py` | `tree_equal` |\n"
    )
    homes = table(text)
    wanted = ("filter_grad", "filter_jvp", "tree_at", "tree_equal")
    wanted += ("internal.debug_backward_nan", "internal.store_dce")
    wanted += ("debug.backward_nan", "internal.noinline_p")
    names = {n: public_names()[n] for n in wanted}
    names["error_if"] = public_names()["filter_vjp"]  # defined in `_vjp.py`
    # a primitive (a JAX object) is checked by its file binding the name
    names["internal.nontraceable_p"] = public_names()["internal.noinline_p"]
    assert mismatches(homes, names) == [
        "not in the table: tree_equal",
        "not public: not_a_name",
        "debug/_dce.py does not define debug.backward_nan",
        "error_if is defined in _transforms/_vjp.py, not _errors.py",
        "_transforms/_jvp.py does not define filter_grad",
        "internal/_misc.py does not define internal.noinline_p",
        "internal/_noinline.py does not define internal.nontraceable_p",
    ]

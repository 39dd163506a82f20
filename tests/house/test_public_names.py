"""Where each public name lives: the table in `src/boxwood/README.md` is the
contract. Every public name of `boxwood`, `boxwood.nn`, `boxwood.debug` and
`boxwood.random` is in it once, and the file it names defines the name (at its top
level, and as the object's own module or code says)."""

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
    "debug.": "boxwood.debug",
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
        return pathlib.Path(code.co_filename).resolve().relative_to(PACKAGE).as_posix()
    cls = target if isinstance(target, type) else type(target)
    if cls.__module__ in NAMESPACES.values():
        return None
    file = importlib.import_module(cls.__module__).__file__
    return pathlib.Path(file).resolve().relative_to(PACKAGE).as_posix()


def mismatches(homes: dict[str, str], names: dict[str, object]) -> list[str]:
    """What is wrong with `homes` for these public names."""
    found = [f"not in the table: {n}" for n in sorted(set(names) - set(homes))]
    found += [f"not public: {n}" for n in sorted(set(homes) - set(names))]
    for name in sorted(set(homes) & set(names)):
        file = homes[name]
        if not _defines(PACKAGE / file, name.rsplit(".", 1)[-1]):
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
        "\n## Next section\n| `_tree.py` | `tree_equal` |\n"
    )
    homes = table(text)
    names = {n: public_names()[n] for n in ("filter_grad", "filter_jvp", "tree_at")}
    names["error_if"] = public_names()["filter_vjp"]  # defined in `_jvp.py`
    names["tree_equal"] = public_names()["tree_equal"]
    assert mismatches(homes, names) == [
        "not in the table: tree_equal",
        "not public: not_a_name",
        "error_if is defined in _transforms/_jvp.py, not _errors.py",
        "_transforms/_jvp.py does not define filter_grad",
    ]

"""A bare clone stands alone: no tracked file refers to a path outside the repository.

A user clones the repository and nothing beside it. A test fixture, script, link or
comment that reaches outside the checkout (a sibling folder, an absolute path on the
machine it was written on) works for its author and fails for every user; this test
fails instead.
"""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Relative paths that climb: `..` and a slash, repeated, then a path.
DOTDOT = re.compile(r"(?:\.\./)+[A-Za-z0-9_.\-/]*")
# Python reaching above the repository: `Path(__file__).parents[k]` with k too large,
# or the repository root's parent.
PARENTS = re.compile(r"parents\[(\d+)\]")
ROOT_PARENT = re.compile(r"\b(?:ROOT|REPO|root|repo)\.parent\b")
# A folder named as a sibling of the checkout in any language's path syntax.
SIBLING = re.compile(r"""(?:["'/]|\.\.)shared["'/]""")
# Absolute paths of the machines this project was written on.
ABSOLUTE = re.compile(r"(?<![A-Za-z0-9_.~])/(?:work|home/[a-z]+)/")

BINARY_SUFFIXES = {".png", ".gguf", ".bin", ".lock"}


def tracked_text_files():
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.split(b"\0")
    for name in names:
        if not name:
            continue
        path = ROOT / name.decode()
        if path.suffix in BINARY_SUFFIXES or not path.is_file():
            continue
        try:
            yield path, path.read_text()
        except UnicodeDecodeError:
            continue


def outside(path: Path) -> bool:
    resolved = path.resolve()
    return resolved != ROOT and ROOT not in resolved.parents


# Files whose `../` chains are hostile inputs to a path check, never paths they read.
TRAVERSAL_TESTS = {"crates/server/src/fetch.rs", "e2e/test_hardening.py"}


def violations_in(path: Path, text: str):
    rel = path.relative_to(ROOT)
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{rel}:{number}: {line.strip()}"
        for m in DOTDOT.finditer(line):
            target = m.group(0)
            # A relative path is read from the file's folder (links, includes) or from the
            # repository root (scripts, commands); one that leaves the checkout either way
            # is a dependency on whatever a user's machine has beside it.
            candidates = [path.parent / target, ROOT / target]
            if all(outside(c) for c in candidates) and rel.as_posix() not in TRAVERSAL_TESTS:
                yield f"{where}  ({target} is outside the repository)"
        if path.suffix == ".py":
            for m in PARENTS.finditer(line):
                if int(m.group(1)) > len(rel.parent.parts):
                    yield f"{where}  (parents[{m.group(1)}] is above the repository)"
            if ROOT_PARENT.search(line):
                yield f"{where}  (the repository root's parent)"
        if SIBLING.search(line):
            yield f"{where}  (a sibling folder of the checkout)"
        if ABSOLUTE.search(line):
            yield f"{where}  (an absolute path of one machine)"


def test_no_tracked_file_refers_outside_the_repository():
    found = [v for path, text in tracked_text_files() for v in violations_in(path, text)]
    assert not found, "tracked files refer to paths outside the repository:\n" + "\n".join(found)


def test_the_check_catches_each_kind_of_reference():
    # The patterns above must fire on the references issue 15 found, or the test above
    # proves nothing.
    fake = ROOT / "e2e" / "example.py"
    # Spelled in pieces so that this file does not hold the references it tests.
    sib, up, top = "sha" + "red", ".." + "/", "/" + "work" + "/"
    cases = [
        f'FIXTURE = Path(__file__).resolve().{"parents"}[2] / "{sib}" / "f.json"',
        "TOOLS = ROOT" + ".parent / 'tools'",
        f"see [API.md]({up}{sib}/API.md)",
        f"open('{top}{sib}/API.md')",
    ]
    for case in cases:
        assert list(violations_in(fake, case)), case
    # A `../` chain that resolves inside the repository is fine; one that leaves it is
    # not, whether or not this machine has something there, except as the input of a
    # path-traversal test.
    assert not list(violations_in(ROOT / "crates" / "server" / "Cargo.toml", f'path = "{up}protocol"'))
    assert list(violations_in(fake, f'model = "{up}{up}models/no-such.gguf"'))
    assert not list(violations_in(ROOT / "e2e" / "test_hardening.py", f'name = "{up}{up}no/such/model"'))
    # A `../` chain to something that exists outside is caught whatever its name.
    assert list(violations_in(ROOT / "README.md", f"the folder above: [up]({up})"))

"""The requirement lines of qserve's core dependencies and the named extras, read from pyproject.toml (its own
self-references, `qserve[a,b]`, expanded): the build stage installs these before qserve itself.

    python3 docker/requirements.py pyproject.toml serve
"""

import sys

import tomllib

project = tomllib.loads(open(sys.argv[1], encoding="utf-8").read())["project"]
extras = project.get("optional-dependencies", {})
lines = list(project["dependencies"])
todo = [e for e in sys.argv[2].split(",") if e] if len(sys.argv) > 2 else []
seen = set()
while todo:
    name = todo.pop()
    if name in seen:
        continue
    if name not in extras:
        sys.exit(f"no extra {name!r} in {sys.argv[1]}; the extras: {', '.join(sorted(extras))}")
    seen.add(name)
    for line in extras[name]:
        if line.startswith("qserve["):
            todo += line[len("qserve[") : line.index("]")].split(",")
        else:
            lines.append(line)
print("\n".join(dict.fromkeys(lines)))

"""Package mapping for the one `cloister` distribution.

`platform/` is a plain folder without `__init__.py` (the standard library owns the
name `platform`), so each package inside it is mapped to its own import name here.
"""

from setuptools import find_packages, setup

ROOTS = {
    "engine": "engine",
    "tenancy": "tenancy",
    "cloister": "platform/cloister",
    "gateway": "platform/gateway",
    "admin": "platform/admin",
    "server": "platform/server",
    "engine_server": "platform/engine_server",
    "engine_hop": "platform/engine_hop",
    "assembly": "platform/assembly",
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for name, path in ROOTS.items():
    package_dir[name] = path
    packages.append(name)
    packages.extend(f"{name}.{sub}" for sub in find_packages(path))

setup(packages=packages, package_dir=package_dir)

"""Build hook: a wheel carries the parts of nestrace that are not Python.

The repository keeps the design card's top level (tracers/, correlate/,
schemas/); building a wheel maps them into the package, as
nestrace/_data/{bin,lib,bpf,sql,schemas,build_id}, after building the static
agent with tracers/Makefile.  The wheel is tagged for the platform (it
holds x86_64 binaries).  An editable install maps nothing: the checkout
is read in place (nestrace/_paths.py).
"""
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:            # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent


class BuildWithAgent(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        data = Path(self.build_lib) / "nestrace" / "_data"
        shutil.rmtree(data, ignore_errors=True)
        subprocess.run(["make", "-s", "-C", str(HERE / "tracers")], check=True)
        built = HERE / "tracers" / "build"
        (data / "bin").mkdir(parents=True)
        shutil.copy2(built / "nestrace-agent", data / "bin" / "nestrace-agent")
        (data / "lib").mkdir()
        shutil.copy2(built / "libnestrace-readers.so", data / "lib" / "libnestrace-readers.so")
        (data / "bpf").mkdir()
        for o in sorted(built.glob("*.bpf.o")):
            shutil.copy2(o, data / "bpf" / o.name)
        shutil.copytree(HERE / "correlate" / "sql", data / "sql")
        (data / "schemas").mkdir()
        shutil.copy2(HERE / "schemas" / "records.toml", data / "schemas" / "records.toml")
        shutil.copy2(built / "build-id", data / "build_id")


class PlatformWheel(bdist_wheel):
    """Any Python 3, this platform: the agent is a static x86_64 binary
    (auditwheel retags the wheel manylinux)."""

    def get_tag(self):
        return "py3", "none", super().get_tag()[2]


class PlatformDistribution(Distribution):
    """(installed to platlib, as a wheel with a binary must be)"""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithAgent, "bdist_wheel": PlatformWheel},
      distclass=PlatformDistribution)

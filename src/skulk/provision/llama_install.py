"""The shell of `skulk engines install`: fetch, verify, extract, compile, install.

Each step is idempotent and resumable: a verified sdist in the cache is reused, an extracted
source tree is reused, the cmake build directory is incremental, and an install is copied
into a temporary directory and renamed into place, so a half-finished install is never seen.
What to build and where is decided by `skulk.provision.llama_build` (pure); this module only
moves bytes and runs cmake. It never builds inside a checkout and never leaves a process
running: the compiler is waited for, or killed with its process group on an exception.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import skulk
from skulk.provision.llama_binary import probe_version
from skulk.provision.llama_build import (
    BUILD_TARGETS,
    MANIFEST_NAME,
    SOURCE_PACKAGE,
    VENDORED_SOURCE_DIR,
    BuildPlan,
    EngineBuildError,
    SdistPin,
    build_progress,
    sdist_pin_from_lock,
    sdist_pin_from_registry,
)

Progress = Callable[[str, int, int | None], None]
"""(step, done, total): 'download' in bytes, 'build' in build steps."""

REGISTRY_URL = "https://pypi.org/pypi/{package}/{version}/json"
REGISTRY_TIMEOUT_S = 60.0
"""Per network operation (connect, each read) while fetching the sdist."""
BUILD_LOG_TAIL_LINES = 40
"""Lines of compiler output quoted in the error when a build fails."""
CHUNK_BYTES = 1 << 20


def installed_version() -> str:
    """The llama-cpp-python version this node runs in-process: the version to build."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(SOURCE_PACKAGE)
    except PackageNotFoundError as exc:
        raise EngineBuildError(f"{SOURCE_PACKAGE} is not installed, so there is no version to pin the build to") from exc


def resolve_pin(version: str) -> SdistPin:
    """The sdist and its sha256: from the checkout's uv.lock when Skulk runs from one (the
    hash every developer's install was verified against), else from the registry's record."""
    lock = _find_lock()
    if lock is not None:
        pin = sdist_pin_from_lock(lock.read_text(encoding="utf-8"), SOURCE_PACKAGE, version)
        if pin is not None:
            return pin
    import httpx

    url = REGISTRY_URL.format(package=SOURCE_PACKAGE, version=version)
    try:
        response = httpx.get(url, timeout=REGISTRY_TIMEOUT_S, follow_redirects=True)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise EngineBuildError(f"cannot read {url}: {exc}") from exc
    pin = sdist_pin_from_registry(response.json(), version)
    if pin is None:
        raise EngineBuildError(f"{SOURCE_PACKAGE} {version} has no source distribution on the registry")
    return pin


def _find_lock() -> Path | None:
    here = Path(skulk.__file__).resolve().parent
    for directory in (here, *here.parents):
        candidate = directory / "uv.lock"
        if candidate.is_file():
            return candidate
    return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist(plan: BuildPlan, progress: Progress) -> Path:
    """The verified sdist in the build cache (downloaded when absent or wrong)."""
    path = plan.sdist_path
    if path.is_file() and sha256_of(path) == plan.pin.sha256:
        return path
    import httpx

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    try:
        with httpx.stream("GET", plan.pin.url, timeout=REGISTRY_TIMEOUT_S, follow_redirects=True) as response:
            response.raise_for_status()
            total = int(response.headers.get("content-length", 0)) or None
            done = 0
            with partial.open("wb") as out:
                for block in response.iter_bytes(CHUNK_BYTES):
                    out.write(block)
                    done += len(block)
                    progress("download", done, total)
    except httpx.HTTPError as exc:
        partial.unlink(missing_ok=True)
        raise EngineBuildError(f"cannot download {plan.pin.url}: {exc}") from exc
    actual = sha256_of(partial)
    if actual != plan.pin.sha256:
        partial.unlink(missing_ok=True)
        raise EngineBuildError(
            f"{plan.pin.filename} has sha256 {actual}, expected {plan.pin.sha256}: refusing to build from it"
        )
    partial.rename(path)
    return path


def extract_source(plan: BuildPlan, sdist: Path) -> Path:
    """vendor/llama.cpp out of the sdist, into the cache (once per version and backend)."""
    target = plan.source_dir
    if (target / "CMakeLists.txt").is_file():
        return target
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tarfile.open(sdist, "r:gz") as archive:
        top = archive.getmembers()[0].name.split("/", 1)[0]
        prefix = f"{top}/{VENDORED_SOURCE_DIR}/"
        members = []
        for member in archive.getmembers():
            if member.name.startswith(prefix):
                member.name = member.name[len(prefix):]
                members.append(member)
        if not members:
            raise EngineBuildError(f"{sdist.name} has no {VENDORED_SOURCE_DIR}")
        archive.extractall(staging, members=members, filter="data")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def compile_engine(plan: BuildPlan, jobs: int, progress: Progress, log_path: Path) -> None:
    """cmake configure + build of llama-server and ggml-rpc-server; incremental."""
    generator = "Ninja" if shutil.which("ninja") else None
    if shutil.which("cmake") is None:
        raise EngineBuildError("cmake is not installed (apt-get install cmake ninja-build g++)")
    plan.build_dir.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", encoding="utf-8") as log:
        _run_logged(plan.configure_command(generator), log, lambda line: None, "configure")
        _run_logged(
            plan.build_command(jobs), log,
            lambda line: (step := build_progress(line)) and progress("build", step[0], step[1]), "build",
        )
    for name in BUILD_TARGETS:
        if not plan.built_binary(name).is_file():
            raise EngineBuildError(f"the build finished without {plan.built_binary(name)}; see {log_path}")


def _run_logged(command: list[str], log, on_line: Callable[[str], object], step: str) -> None:
    tail: deque[str] = deque(maxlen=BUILD_LOG_TAIL_LINES)
    log.write("$ " + " ".join(command) + "\n")
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            tail.append(line.rstrip())
            on_line(line)
        code = process.wait()
    except BaseException:
        _kill_group(process)
        raise
    if code != 0:
        raise EngineBuildError(f"cmake {step} failed (exit {code}):\n" + "\n".join(tail))


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def install_built(plan: BuildPlan) -> Path:
    """Copy the built binaries into the engines dir (atomically) and check they answer."""
    final = plan.install_dir
    staging = final.with_name(final.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "bin").mkdir(parents=True)
    for name in BUILD_TARGETS:
        shutil.copy2(plan.built_binary(name), staging / "bin" / name)
    version_line = probe_version(staging / "bin" / BUILD_TARGETS[0])
    if version_line is None:
        shutil.rmtree(staging, ignore_errors=True)
        raise EngineBuildError(f"the built {BUILD_TARGETS[0]} does not answer --version")
    manifest = {
        "version": plan.pin.version,
        "backend": plan.backend,
        "sdist_sha256": plan.pin.sha256,
        "binaries": list(BUILD_TARGETS),
        "reports": version_line,
        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return final


LOCK_NAME = ".install.lock"
LOCK_WAIT_S = 3 * 3600.0
"""How long an install waits for another one on this machine (a first build on a slow box
takes most of an hour) before it gives up."""
LOCK_POLL_S = 2.0


@contextmanager
def machine_install_lock(cache_root: Path, progress: Progress, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """One install at a time on a machine: every node here shares the build cache (and the
    engines dir), and two builds of one version would race on both. A second install waits
    (reporting step 'wait' in seconds) and then, the cache being warm, is a copy."""
    cache_root.mkdir(parents=True, exist_ok=True)
    with (cache_root / LOCK_NAME).open("a+") as handle:
        deadline = time.monotonic() + wait_s
        waited = 0
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise EngineBuildError(
                        f"another install held {cache_root / LOCK_NAME} for {wait_s:g}s; try again later") from None
                progress("wait", waited, None)
                time.sleep(LOCK_POLL_S)
                waited += int(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def install_running(cache_root: Path) -> bool:
    """An install holds the machine's install lock now (read-only: never creates the file)."""
    try:
        with (cache_root / LOCK_NAME).open("r") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def install_engine(plan: BuildPlan, jobs: int, progress: Progress) -> Path:
    """The whole pipeline, one install at a time on the machine; returns the install directory."""
    with machine_install_lock(plan.cache_root, progress):
        sdist = fetch_sdist(plan, progress)
        extract_source(plan, sdist)
        compile_engine(plan, jobs, progress, plan.build_dir.parent / "build.log")
        progress("install", 0, None)
        return install_built(plan)


__all__ = [
    "compile_engine",
    "extract_source",
    "fetch_sdist",
    "install_built",
    "install_engine",
    "install_running",
    "installed_version",
    "machine_install_lock",
    "resolve_pin",
    "sha256_of",
]

"""The contract of a model file opened on a runtime: what every command runs files through.

``irpe serve`` (its backends add batching, device and normalisation only), ``irpe validate``,
``irpe eval`` and the benchmarks open a file with :func:`irpe.runtime.pick.open_file` and get a
:class:`RuntimeFile`: its spec and precision, its input and output names, ``run`` on host
arrays, and one line describing how it runs. One implementation per runtime lives in
``irpe/runtime/<name>/file.py``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any, ClassVar, Collection, Dict, Mapping, Optional, Sequence, Tuple, TypeVar

import numpy as np

from irpe.artifact.contract import input_names, output_names
from irpe.artifact.files import FileInfo, check_classes
from irpe.errors import InvalidInput

__all__ = ["Feeds", "RuntimeFile", "options_from_env"]

Feeds = Dict[str, np.ndarray]  # the export contract's inputs by name, host arrays
Options = TypeVar("Options")


def options_from_env(options: Options, given: Mapping[str, Tuple[str, Optional[str]]],
                     blank_is_set: Collection[str] = ()) -> Options:
    """A runtime's frozen options (a dataclass that checks itself) with each field of ``given``
    (field -> (environment variable, its value as the caller read it)) replaced by the value
    where it is set; a blank value counts as unset unless the field is in ``blank_is_set``. A
    bad value is InvalidInput of one line naming the variable: the one way the runtimes apply
    the environment (OrtOptions.from_env, OvOptions.from_env, which read it by name)."""
    for key, (name, value) in given.items():
        if value is None or (not value.strip() and key not in blank_is_set):
            continue
        change: Dict[str, Any] = {key: value}  # the setting's text: the options parse it
        try:
            options = replace(options, **change)  # type: ignore[type-var]
        except InvalidInput as exc:
            raise InvalidInput(f"{name}={value!r}: {exc}") from None
    return options


class RuntimeFile(ABC):
    """A file opened on one runtime. ``info`` is the file's metadata (irpe.artifact.files);
    subclasses load the file in ``__init__``, set ``inputs``, ``outputs``, ``precision`` (what
    it runs in: the file's int8, else the compiled precision) and ``description``, and call
    :meth:`check_contract` with the outputs' static shapes."""

    runtime: ClassVar[str]  # onnxruntime | openvino | tensorrt
    inputs: Tuple[str, ...]
    outputs: Tuple[str, ...]
    precision: str
    description: str

    def __init__(self, info: FileInfo) -> None:
        self.info = info

    @property
    def path(self) -> str:
        """The file's path as given."""
        return self.info.path

    @property
    def spec(self):  # noqa: ANN201 - irpe.artifact.trained.ModelSpec (imports torch)
        """The file's :class:`irpe.artifact.trained.ModelSpec`."""
        return self.info.spec

    @property
    def props(self) -> Mapping[str, str]:
        """The file's ``irpe.*`` metadata."""
        return self.info.props

    def check_contract(self, shapes: Mapping[str, Tuple[Optional[int], ...]]) -> None:
        """The loaded file against the export contract of its task (inputs exactly, outputs
        at least) and its class list against its outputs' widths: one line (InvalidInput /
        RuntimeError) naming the file when it breaks either."""
        task = self.spec.task
        if set(self.inputs) != set(input_names(task)) or \
                not set(output_names(task)) <= set(self.outputs):
            raise RuntimeError(f"{self.path}: inputs {list(self.inputs)} / outputs "
                               f"{list(self.outputs)} are not the {task} export contract "
                               f"({list(input_names(task))} -> {list(output_names(task))})")
        check_classes(self.path, self.spec, shapes)

    def feeds(self, images: np.ndarray, sizes: Optional[np.ndarray] = None) -> Feeds:
        """The contract's inputs as contiguous host arrays (float32 images; int64 sizes for
        detection)."""
        out = {"images": np.ascontiguousarray(images, dtype=np.float32)}
        if self.spec.task == "detection":
            if sizes is None:
                raise ValueError(f"{self.path}: a detection model needs sizes")
            out["sizes"] = np.ascontiguousarray(sizes, dtype=np.int64)
        return out

    @abstractmethod
    def run(self, feeds: Feeds, names: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
        """The outputs ``names`` (default: all the file's) of one batch of host ``feeds``,
        as host arrays the caller owns."""

    def close(self) -> None:  # noqa: B027 - a default: not every runtime holds anything
        """Release the runtime's resources."""

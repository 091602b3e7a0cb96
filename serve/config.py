"""Server settings: a model-repository file (YAML or TOML) plus ``IRPE_SERVE_*`` env variables.

Priority, highest first: explicit arguments (the CLI), environment variables
(``IRPE_SERVE_PORT=9000``, ``IRPE_SERVE_MODELS='[{"name": ...}]'``), the repository file named by
``repository`` / ``IRPE_SERVE_REPOSITORY``, defaults. The file uses the same keys as the
settings (``host``, ``port``, ``models: [...]``); relative model paths are resolved against
the file's folder. The ONNX Runtime switches (``ort_custom_ops``, ``ort_ops_library``,
``ort_rewrites``) and ``fused_attention`` also take the older variables (``IRPE_ORT_*``,
``IRPE_FUSED_ATTENTION``) when their ``IRPE_SERVE_*`` name is not set; a model's own
``ort_custom_ops`` / ``ort_rewrites`` win over the server's, as its ``ov_threads`` /
``ov_streams`` win over the server's ``threads`` / ``ov_streams`` (docs/settings.md).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, List, Literal, Optional, Tuple, Type, Union

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from irpe.runtime.graph.rewrites import STAGES, parse_stages
from irpe.runtime.onnxruntime.session import OrtOptions
from irpe.runtime.openvino.session import OvOptions
from irpe.switch import Switch, normalize_switch

from .ray_settings import RaySettings
from .registry import AUTO, auto_backend, backend_names, check_backend
from .repository import read_repository
from .settings_sources import FieldNames, RepositorySource

__all__ = ["ModelConfig", "ServeSettings", "read_repository"]

OV_STREAMS = 1  # the server's default OpenVINO streams (ServeSettings.ov_streams)
# settings that only one backend reads: set on a model of another backend, they are refused
BACKEND_FIELDS = {"onnxruntime": ("providers", "ort_custom_ops", "ort_rewrites",
                                  "ort_ops_library"),
                  "openvino": ("ov_threads", "ov_streams", "ov_ops", "ov_ops_library")}
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def _switch(value: Any) -> Any:
    """A before-validator of an auto/on/off setting (irpe.switch): a string lower-cased with
    the older spellings (1/true/yes, 0/false/no, fused/unfused) mapped to on/off; a boolean
    (YAML reads an unquoted on/off/yes/no as one) as on/off."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return normalize_switch(value) if isinstance(value, str) else value


def _rewrites(value: str) -> str:
    """Load-time graph rewrite stages, checked (irpe.runtime.graph.rewrites.parse_stages)
    and written as 0 or the stage list in the order applied."""
    stages = parse_stages(value)
    return ",".join(s for s in STAGES if s in stages) or "0"


def _origins(value: Any) -> Any:
    """CORS origins from the environment: a JSON list (``["https://a.example"]``) or, as
    users write it, a plain comma list (``https://a.example,https://b.example``)."""
    if not isinstance(value, str):
        return value
    if value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ValueError(f"not a JSON list ({exc})") from None
    return [origin.strip() for origin in value.split(",") if origin.strip()]


SwitchSetting = Annotated[Switch, BeforeValidator(_switch)]
Origins = Annotated[List[str], NoDecode, BeforeValidator(_origins)]
Rewrites = Annotated[str, AfterValidator(_rewrites)]


def _env(name: str, *older: str) -> AliasChoices:
    """The field's ``IRPE_SERVE_*`` variable, then the older names it replaces (the field's
    own name still works in code and in the repository file: populate_by_name)."""
    return AliasChoices(f"IRPE_SERVE_{name.upper()}", *older)


class ModelConfig(BaseModel):
    """One served model: artifact, backend, batching and device."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    path: Path = Field(description="trained-model .safetensors (torch), .onnx (onnxruntime, "
                       "openvino), OpenVINO IR .xml (openvino) or engine file (tensorrt)")
    backend: str = Field(AUTO, description="torch, onnxruntime, tensorrt, openvino, a name "
                         "given to serve.backends.register_backend, or auto (the default): by "
                         "the file: .onnx -> openvino on cpu where installed, else "
                         "onnxruntime; .xml -> openvino; .engine/.plan -> tensorrt; else torch")
    task: Optional[Literal["classification", "detection"]] = Field(
        None, description="checked against the artifact's task when given")
    labels: Optional[Union[List[str], Path]] = Field(
        None, description="class names (list or a text file, one per line); default: artifact's")
    max_batch_size: int = Field(8, ge=1, le=1024)
    max_queue_delay_ms: float = Field(5.0, ge=0, le=60_000)
    max_queue_size: int = Field(64, ge=1, description="images waiting; more -> 503")
    timeout_s: float = Field(30.0, gt=0, description="per request; slower -> 504")
    device: str = Field("cpu", description="cpu, cuda or cuda:N")
    providers: Optional[List[str]] = Field(
        None, description="onnxruntime execution providers in priority order; default by device")
    plugins: List[Path] = Field(default_factory=list, description="tensorrt plugin libraries")
    ort_custom_ops: Optional[SwitchSetting] = Field(
        None, description="onnxruntime: iRPE custom-op library (plugins/onnxruntime) auto/on/off; "
        "default: the server's ort_custom_ops")
    ort_rewrites: Optional[Rewrites] = Field(
        None, description="onnxruntime with the library: load-time graph rewrite stages, 1 (all), "
        "0 (none) or a comma list of qlayout, gather, scatter, softmax, attention; default: the "
        "server's ort_rewrites")
    ort_ops_library: Optional[Path] = Field(
        None, description="onnxruntime: the custom-op library file; default: the server's "
        "ort_ops_library")
    metadata: Optional[Path] = Field(
        None, description="tensorrt: .onnx or .safetensors holding the irpe metadata "
        "(default: the engine path with suffix .onnx)")
    precision: Optional[Literal["fp32", "fp16", "bf16"]] = Field(
        None, description="torch backend: weights and inputs cast to this dtype, outputs back "
        "to fp32; default fp16 on cuda, fp32 on cpu. openvino: fp32 (default) or bf16 (a CPU "
        "with BF16), set explicitly at compile. Other backends: fp32 only")
    ov_threads: Optional[int] = Field(
        None, ge=0, description="openvino: CPU inference threads (INFERENCE_NUM_THREADS), 0 = "
        "OpenVINO's default; default: the server's threads")
    ov_streams: Optional[int] = Field(
        None, ge=0, description="openvino: CPU streams (NUM_STREAMS), 0 = OpenVINO's choice; "
        "default: the server's ov_streams")
    ov_ops: Optional[SwitchSetting] = Field(
        None, description="openvino: the iRPE OpenVINO library (plugins/openvino) auto/on/off; "
        "default: the server's ov_ops")
    ov_ops_library: Optional[Path] = Field(
        None, description="openvino: the iRPE OpenVINO library file; default: the server's "
        "ov_ops_library")
    cuda_graphs: bool = Field(False, description="torch backend on cuda, classification: "
                              "capture CUDA graphs at batch sizes 1, 2, 4, ... max_batch_size")
    instances: int = Field(1, ge=1, le=64, description="model replicas (each with its own "
                           "inference thread) draining this model's one queue")
    gpu_decode: bool = Field(True, description="torch backend on cuda: decode JPEGs with "
                             "nvJPEG (torchvision) when torchvision imports; else the CPU pool")

    @field_validator("backend")
    @classmethod
    def _check_backend(cls, value: str) -> str:
        if value != AUTO and value not in backend_names():
            names = ", ".join((*backend_names(), AUTO))
            raise PydanticCustomError("backend", "should be one of {names}, got '{value}'",
                                      {"names": names, "value": value})
        return value

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {value!r}")
        return value

    @model_validator(mode="after")
    def _resolve_backend(self) -> "ModelConfig":
        """``backend: auto`` becomes the backend its file and device call for, so /v1/models,
        the logs and every check below see a real one."""
        if self.backend == AUTO:
            self.backend = auto_backend(self.path, self.device)
        else:
            check_backend(self.path, self.device, self.backend)
        for backend, names in BACKEND_FIELDS.items():
            given = [n for n in names if getattr(self, n) is not None]
            if given and self.backend != backend:
                what = "these are settings" if len(given) > 1 else "it is a setting"
                raise ValueError(f"{', '.join(given)}: {what} of the {backend} backend; this "
                                 f"model runs on {self.backend}")
        return self

    @model_validator(mode="after")
    def _check_runtime_options(self) -> "ModelConfig":
        """Refuse precision / CUDA-graph settings the configured backend and device cannot run."""
        precision = self.precision or "fp32"
        if self.backend == "openvino":
            return self._check_openvino(precision)
        if precision != "fp32" and self.backend in ("onnxruntime", "tensorrt"):
            how = ("tensorrt engines get their precision when built (irpe build-engine "
                   "--precision)" if self.backend == "tensorrt" else
                   "onnxruntime runs the ONNX file in the precision it was exported in")
            raise ValueError(f"precision {precision} needs the torch backend: {how}")
        if precision == "fp16" and self.device == "cpu":
            raise ValueError("precision fp16 is not supported on cpu (slower than fp32 "
                             "there); use bf16 or fp32")
        if self.cuda_graphs and (self.backend != "torch" or not self.device.startswith("cuda")):
            raise ValueError("cuda_graphs needs backend torch and device cuda, got "
                             f"{self.backend} on {self.device}")
        return self

    def _check_openvino(self, precision: str) -> "ModelConfig":
        """The openvino backend runs on the CPU plugin, in fp32 or bf16."""
        if self.device != "cpu":
            raise ValueError(f"the openvino backend runs on cpu (OpenVINO's CPU plugin), got "
                             f"device {self.device}")
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"precision {precision}: the openvino backend runs fp32 or bf16")
        if self.cuda_graphs:
            raise ValueError("cuda_graphs needs backend torch and device cuda, got openvino")
        return self

    def ov_options(self, threads: int = 0) -> OvOptions:
        """How the openvino backend compiles this model: its precision, its ``ov_threads``
        (else ``threads``, the server's), ``ov_streams`` (else the server's default) and
        library switches."""
        return OvOptions(self.run_precision(), threads if self.ov_threads is None
                         else self.ov_threads, OV_STREAMS if self.ov_streams is None
                         else self.ov_streams, "latency", ops=self.ov_ops or "auto",
                         library=str(self.ov_ops_library or ""))

    def ort_options(self) -> OrtOptions:
        """How the onnxruntime backend makes this model's session (its switches, completed by
        the server's: ServeSettings.completed)."""
        return OrtOptions().with_(self.ort_custom_ops, self.ort_ops_library, self.ort_rewrites)

    def run_precision(self) -> str:
        """The precision the model runs in: the configured one, else fp16 on cuda, fp32."""
        if self.precision is not None:
            return self.precision
        return "fp16" if self.device.startswith("cuda") and self.backend == "torch" else "fp32"

    def class_names(self) -> Optional[List[str]]:
        """Configured labels (a list, or read from the labels file), or None."""
        if self.labels is None or isinstance(self.labels, list):
            return self.labels
        lines = Path(self.labels).read_text(encoding="utf-8").splitlines()
        return [line.strip() for line in lines if line.strip()]


class ServeSettings(BaseSettings):
    """Everything ``irpe serve`` needs; see the module docstring for sources."""

    model_config = SettingsConfigDict(env_prefix="IRPE_SERVE_", extra="forbid",
                                      populate_by_name=True, loc_by_alias=False)
    repository: Optional[Path] = Field(None, description="model-repository file (.yaml/.toml)")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    models: List[ModelConfig] = Field(default_factory=list)
    default_classifier: Optional[str] = Field(None, description="/v1/classify target")
    default_detector: Optional[str] = Field(None, description="/v1/detect target")
    auth_token: Optional[SecretStr] = Field(None, description="bearer token for inference")
    max_body_bytes: int = Field(32 << 20, ge=1024)
    max_images: int = Field(32, ge=1, description="images per request")
    v2_nonfinite: Literal["accept", "reject"] = Field(
        "accept", description="/v2 FP32 images holding NaN or infinity: accept (computed as "
        "given, as Triton does: Triton's perf_analyzer sends random bytes by default; other "
        "images of the batch are unaffected) or reject (400 images contain NaN or infinity)")
    cors_origins: Origins = Field(default_factory=list, description="empty: CORS off; "
                                  "IRPE_SERVE_CORS_ORIGINS: a JSON list or a comma list")
    ui: bool = Field(True, description="the playground page /ui (docs/ui.md): static files "
                     "that call the public /v1 routes like any client (the API key too); "
                     "false: no /ui routes")
    threads: int = Field(0, ge=0, description="torch / onnxruntime / openvino CPU threads; "
                         "0 = default (a model's ov_threads wins for openvino)")
    ort_thread_pool: Literal["shared", "per_model"] = Field(
        "shared", description="irpe serve: the onnxruntime models share ONE intra-op pool of "
        "`threads` threads, so one model's idle workers never spin beside another's run; "
        "per_model: a pool each. Only `irpe serve` makes the shared pool (ONNX Runtime's "
        "global pool is process-wide); an app built in another process keeps pools per model")
    ort_custom_ops: SwitchSetting = Field(
        "auto", validation_alias=_env("ort_custom_ops", "IRPE_ORT_CUSTOM_OPS"),
        description="onnxruntime models: the iRPE custom-op library auto (when found), on "
        "(required) or off (the file's ONNX functions); a model's ort_custom_ops wins")
    ort_ops_library: Optional[Path] = Field(
        None, validation_alias=_env("ort_ops_library", "IRPE_ORT_OPS_LIBRARY"),
        description="the custom-op library file (default: build/plugins/libirpe_ort_ops.so, "
        "libirpe_ort_ops_cuda.so on a GPU provider)")
    ort_rewrites: Rewrites = Field(
        "1", validation_alias=_env("ort_rewrites", "IRPE_ORT_FUSE"),
        description="onnxruntime with the library: load-time graph rewrite stages, 1 (all), 0 "
        "(none) or a comma list of qlayout, gather, scatter, softmax, attention; a model's "
        "ort_rewrites wins")
    fused_attention: Optional[SwitchSetting] = Field(
        None, validation_alias=_env("fused_attention", "IRPE_FUSED_ATTENTION"),
        description="torch models: the fused iRPE attention paths auto (Triton on CUDA, SDPA "
        "on CPU, where supported), on (forced where supported) or off (the unfused path); "
        "process-wide (irpe.fused)")
    ov_streams: int = Field(
        OV_STREAMS, ge=0, description="openvino models: CPU streams (NUM_STREAMS); 1 suits the "
        "server, whose inference thread runs one batch at a time per instance; 0 = OpenVINO's "
        "choice from the latency hint; a model's ov_streams wins")
    ov_ops: SwitchSetting = Field(
        "auto", validation_alias=_env("ov_ops", "IRPE_OV_OPS"),
        description="openvino models: the iRPE OpenVINO library auto (when built), on "
        "(required) or off (the frontend conversions); a model's ov_ops wins")
    ov_ops_library: Optional[Path] = Field(
        None, validation_alias=_env("ov_ops_library", "IRPE_OV_OPS_LIBRARY"),
        description="the iRPE OpenVINO library file (default: build/plugins/libirpe_openvino.so)")
    decode_threads: int = Field(0, ge=0, description="image decode threads, process-wide; "
                                "0 = the CPUs this process may run on")
    gc_freeze: bool = Field(True, description="once a model has loaded, freeze the process's "
                            "objects out of Python's cyclic garbage collector (gc.freeze): full "
                            "collections then scan only what requests allocate, not the "
                            "libraries and models, and stop stalling every request in flight")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = "json"
    drain_grace_s: float = Field(
        5.0, ge=0, le=600, description="SIGTERM: seconds readiness answers 503 while requests "
        "are still served (each answer with Connection: close), so load balancers notice before "
        "the listener and the idle keep-alive connections close; SIGINT skips it")
    shutdown_timeout_s: float = Field(30.0, gt=0, description="after the grace: the most "
                                      "seconds in-flight requests get to finish")
    cache_dir: Optional[Path] = Field(None, description="demo ONNX files (default irpe cache)")
    ray: RaySettings = Field(default_factory=RaySettings, description="irpe serve --ray / "
                             "--ray-config: replicas, resources, autoscaling on Ray Serve")
    bucket_cache_mib: Optional[float] = Field(
        None, ge=0, description="torch backend: bucket-id cache limit in MiB, process-wide LRU "
        "(default: $IRPE_BUCKET_CACHE_MIB or 64)")
    tracing: SwitchSetting = Field(
        "auto", description="OpenTelemetry traces (docs/tracing.md; pip install "
        "'irpe-deploy[trace]'): auto: on when otlp_endpoint is set or OTEL_TRACES_EXPORTER names "
        "an exporter; on; off: never, whatever the OTEL_* variables say")
    otlp_endpoint: Optional[str] = Field(
        None, pattern=r"^https?://\S+$", description="OTLP/HTTP traces URL, used as is (e.g. "
        "http://127.0.0.1:4318/v1/traces); setting it turns tracing on; default: the OTEL_* "
        "endpoint variables, else http://localhost:4318/v1/traces")
    trace_sample_ratio: Optional[float] = Field(
        None, ge=0, le=1, description="share of requests traced, by trace id; a traceparent's "
        "sampled flag wins (parent-based); default: OTEL_TRACES_SAMPLER(_ARG), else every one")

    @classmethod
    def settings_customise_sources(cls, settings_cls: Type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource
                                   ) -> Tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, FieldNames(settings_cls, env_settings), RepositorySource(settings_cls)

    @model_validator(mode="after")
    def _complete_models(self) -> "ServeSettings":
        """Each model's ONNX Runtime and OpenVINO switches: its own, else the server's."""
        self.models = [self.completed(m) for m in self.models]
        return self

    def completed(self, model: ModelConfig) -> ModelConfig:
        """``model`` with the server's switches of its backend where it sets none: ONNX
        Runtime's for an onnxruntime model, OpenVINO's for an openvino one (threads: the
        server's ``threads``); a model of another backend keeps none of them."""
        if model.backend == "onnxruntime":
            return model.model_copy(update={
                "ort_custom_ops": model.ort_custom_ops or self.ort_custom_ops,
                "ort_rewrites": model.ort_rewrites or self.ort_rewrites,
                "ort_ops_library": model.ort_ops_library or self.ort_ops_library})
        if model.backend == "openvino":
            return model.model_copy(update={
                "ov_ops": model.ov_ops or self.ov_ops,
                "ov_ops_library": model.ov_ops_library or self.ov_ops_library,
                "ov_threads": self.threads if model.ov_threads is None else model.ov_threads,
                "ov_streams": self.ov_streams if model.ov_streams is None
                else model.ov_streams})
        return model

    def with_models(self, models: List[ModelConfig]) -> "ServeSettings":
        """These settings serving ``models`` (completed as at validation)."""
        return self.model_copy(update={"models": [self.completed(m) for m in models]})

    def model_names(self) -> List[str]:
        """Names of the configured models, in order."""
        return [m.name for m in self.models]

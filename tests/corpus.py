"""The real-model corpus: ONNX models shipped inside pinned PyPI wheels, downloaded by the test suite, never committed.

Sixteen models from seven wheels (OCR detection/recognition/classification, captcha CRNNs and a YOLOX detector,
the Silero voice-activity detectors, a graph transformer for chemistry, a byte-level file-type classifier, a
YOLOv8 detector, the VAD faster-whisper ships)::

    rapidocr-onnxruntime==1.4.4   ch_PP-OCRv4_det_infer, ch_PP-OCRv4_rec_infer, ch_ppocr_mobile_v2.0_cls_infer
    ddddocr==1.6.1                common, common_old (dynamically quantized), common_det
    silero-vad==6.2.3             silero_vad, silero_vad_16k_op15, silero_vad_16k_sequence, silero_vad_half,
                                  silero_vad_op18_ifless, silero_vad_openvino_16k
    chython-rxnmap==2.0           rxnmap
    magika==1.0.3                 standard_v3_3 (bytes of a file -> 214 content types)
    nudenet==3.4.2                320n (YOLOv8n detector, 18 classes)
    faster-whisper==1.2.1         silero_vad_v6

Each wheel is fetched with ``python -m pip download --no-deps --only-binary=:all: PKG==VER`` into
``$XDG_CACHE_HOME/ortcompile-tests/corpus`` (default ``~/.cache/ortcompile-tests/corpus``), checked against the
sha256 pinned below, and every ``.onnx`` file in it is extracted and checked against its own pin. Files already
present and verified are neither downloaded nor extracted again; a corrupted model is re-extracted from the
cached wheel, a corrupted wheel is downloaded again. Concurrent fetches (two test processes, ``pytest -n``) are
serialised by an exclusive lock on ``corpus/.lock``, and every file is written under a temporary name and
renamed into place, so a reader never sees a partial file.

Every model carries what a user would give to compile it for an NPU (``fix_dims`` / ``fix_shapes``, chosen from
how the wheel's own Python code calls the model) and hints for realistic inputs (value ranges, the sample rate,
the state shape, the size of the embedding tables that integer inputs index); :func:`make_inputs` builds seeded
random or synthetic realistic inputs from them without any further download.

From tests: :func:`require_corpus` returns the models, skips when the download is impossible (no network, no pip)
and fails instead when the environment variable ``CI`` is set. From a shell::

    python tests/corpus.py fetch [--cache DIR] [--package PKG]...
    python tests/corpus.py list [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock (the suite targets Linux and macOS)
    fcntl = None  # type: ignore[assignment]

CACHE_SUBDIR = Path("ortcompile-tests") / "corpus"
PIP_TIMEOUT_S = 900  # the whole `pip download` of one wheel (the largest is 79 MB)


# ---------------------------------------------------------------- pins


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel: the requirement, the file pip saves and its sha256."""

    requirement: str  # "silero-vad==6.2.3"
    filename: str
    sha256: str
    alias: str  # the short prefix of model ids: "silero"


WHEELS: dict[str, Wheel] = {w.requirement.split("==")[0]: w for w in [
    Wheel("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
          "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf", "rapidocr"),
    Wheel("ddddocr==1.6.1", "ddddocr-1.6.1-py3-none-any.whl",
          "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935", "ddddocr"),
    Wheel("silero-vad==6.2.3", "silero_vad-6.2.3-py3-none-any.whl",
          "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8", "silero"),
    Wheel("chython-rxnmap==2.0", "chython_rxnmap-2.0-py3-none-any.whl",
          "c330c6b2250bd024807abffc45f51d2953489fa52a9caa20e82572e4463d5de6", "rxnmap"),
    Wheel("magika==1.0.3", "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",  # Linux x86_64 (its Rust CLI is inside)
          "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529", "magika"),
    Wheel("nudenet==3.4.2", "nudenet-3.4.2-py3-none-any.whl",
          "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331", "nudenet"),
    Wheel("faster-whisper==1.2.1", "faster_whisper-1.2.1-py3-none-any.whl",
          "79a66ad50688c0b794dd501dc340a736992a6342f7f95e5811be60b5224a26a7", "whisper"),
]}


@dataclass(frozen=True)
class InputHint:
    """What a realistic value of one graph input looks like (after the pins).

    ``kind``: ``image`` (float pixels in [low, high]), ``audio`` (float samples in [-1, 1] at ``value`` Hz),
    ``state`` (recurrent state; zeros at the start of a stream), ``constant`` (must be exactly ``value``),
    ``index`` (integers in [low, high): ``high`` is the size of the table the input is gathered from).
    """

    name: str
    kind: str
    dtype: str  # numpy dtype name
    shape: tuple[int, ...]
    low: float | None = None
    high: float | None = None
    value: float | int | None = None
    note: str = ""


@dataclass(frozen=True)
class CorpusModel:
    """One model of the corpus: where it is, what it is, and how a user would compile and feed it."""

    id: str  # "rapidocr/ch_PP-OCRv4_det_infer"
    package: str  # the pinned requirement, "rapidocr-onnxruntime==1.4.4"
    member: str  # path of the .onnx inside the wheel
    sha256: str
    size: int
    fix_dims: dict[str, int] = field(default_factory=dict)  # --fix-dim NAME=N
    fix_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # --fix-shape INPUT=d0,d1,...
    inputs: tuple[InputHint, ...] = ()
    realistic: str = ""  # what make_inputs(kind="realistic") synthesizes
    notes: str = ""
    # QNN commands beyond the plain one, as option lists after the pins; REALISTIC_FILE stands for make_inputs()
    # saved as an .npz (a user's own sample), e.g. ("--inputs", REALISTIC_FILE, "--fallback", "auto")
    qnn_extra: tuple[tuple[str, ...], ...] = ()
    path: Path = Path()  # set by ensure_corpus()

    @property
    def name(self) -> str:
        return self.id.split("/", 1)[1]

    def cli_pins(self) -> list[str]:
        """The pins as ortcompile command-line options."""
        args = []
        for dim, n in self.fix_dims.items():
            args += ["--fix-dim", f"{dim}={n}"]
        for name, shape in self.fix_shapes.items():
            args += ["--fix-shape", f"{name}={','.join(map(str, shape))}"]
        return args

    def hint(self, name: str) -> InputHint:
        return next(h for h in self.inputs if h.name == name)

    @property
    def constants(self) -> dict[str, float | int]:
        """Inputs that must hold one value (silero's sr=16000): what a user would freeze for an NPU build."""
        return {h.name: h.value for h in self.inputs if h.kind == "constant" and h.value is not None}


REALISTIC_FILE = "realistic.npz"


def _image(name: str, shape: tuple[int, ...], low: float, high: float, note: str) -> InputHint:
    return InputHint(name, "image", "float32", shape, low=low, high=high, note=note)


_SILERO_STATE = InputHint("state", "state", "float32", (2, 1, 128), low=-1.0, high=1.0,
                          note="LSTM (h, c) stacked; zeros at the start of a stream, then the previous stateN")
_SILERO_SR = InputHint("sr", "constant", "int64", (), value=16000, note="sample rate: 16000 (8000 is the other supported one)")
_SILERO_AUDIO_NOTE = "64 samples of context (the previous frame's tail) + a 512-sample frame of 16 kHz mono audio in [-1, 1]"
_SILERO_AUDIO = InputHint("input", "audio", "float32", (1, 576), low=-1.0, high=1.0, value=16000, note=_SILERO_AUDIO_NOTE)
_SILERO_REALISTIC = "a 440 Hz sine (+ harmonics) with 1% noise at 16 kHz, zero state, sr=16000"
_SILERO_WHY = ("silero_vad.utils_vad.OnnxWrapper feeds input=(batch, 64 + 512) at 16 kHz (context + frame), "
               "state=(2, batch, 128), sr=int64 scalar; batch=1 for streaming")
_SEQUENCE_FRAMES = 64

# The models, in wheel order. Pins and hints are decided from the wheels' own Python code:
# rapidocr_onnxruntime/config.yaml + ch_ppocr_*/ (preprocessing), ddddocr/core/ocr_engine.py and
# detection_engine.py, silero_vad/utils_vad.py (OnnxWrapper) and sequence_vad.py, chython/algorithms/attention.py
# (chython-rxnmap only ships the weights; chython encodes the reaction).
_MODELS: list[CorpusModel] = [
    CorpusModel(
        "rapidocr/ch_PP-OCRv4_det_infer", "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9", 4745517,
        fix_shapes={"x": (1, 3, 640, 640)},
        inputs=(_image("x", (1, 3, 640, 640), -1.0, 1.0, "RGB, (pixel/255 - 0.5)/0.5; sides multiples of 32"),),
        realistic="a white 640x640 page with lines of dark text-like strokes",
        notes="DB text detector; output: text probability map (1, 1, H, W) in [0, 1]. rapidocr resizes the short side "
              "to 736 (config.yaml limit_side_len, rounded to 32): a fixed 640x640 is the usual NPU choice; 736x736 also works",
    ),
    CorpusModel(
        "rapidocr/ch_PP-OCRv4_rec_infer", "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b", 10857958,
        fix_shapes={"x": (1, 3, 48, 320)},
        inputs=(_image("x", (1, 3, 48, 320), -1.0, 1.0, "one text line, height 48, (pixel/255 - 0.5)/0.5, right-padded with 0"),),
        realistic="a 48x320 white text line with dark strokes",
        notes="SVTR CRNN recognizer; output: per-column softmax over 6625 characters (CTC): compare argmax. "
              "config.yaml rec_img_shape [3, 48, 320]; the height dim is unnamed ('?') in the model",
    ),
    CorpusModel(
        "rapidocr/ch_ppocr_mobile_v2.0_cls_infer", "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", 585532,
        fix_shapes={"x": (1, 3, 48, 192)},
        inputs=(_image("x", (1, 3, 48, 192), -1.0, 1.0, "one text line, (pixel/255 - 0.5)/0.5, right-padded with 0"),),
        realistic="a 48x192 white text line with dark strokes",
        notes="0/180 degree text-direction classifier; output (1, 2) softmax: compare argmax. config.yaml cls_image_shape "
              "[3, 48, 192]. Its input is x[-1, 3, ?, ?]: dim_value -1 and unnamed dims, pinnable only with --fix-shape",
    ),
    CorpusModel(
        "ddddocr/common", "ddddocr==1.6.1", "ddddocr/common.onnx",
        "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8", 54088400,
        fix_dims={"image_width": 192},
        inputs=(_image("input1", (1, 1, 64, 192), 0.0, 1.0, "grayscale captcha resized to height 64, pixel/255"),),
        realistic="a 64x192 grayscale captcha: light noisy background, dark strokes",
        notes="captcha CRNN (beta model): output (width/8, 1, 8210) CTC scores, argmax per step; the model declares "
              "the output as [1, seqlen], which is wrong (ORT warns). ddddocr resizes to height 64 keeping the "
              "aspect ratio: 192 fits the usual 3:1 captcha",
    ),
    CorpusModel(
        "ddddocr/common_old", "ddddocr==1.6.1", "ddddocr/common_old.onnx",
        "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68", 13606051,
        fix_dims={"image_width": 192},
        inputs=(_image("input1", (1, 1, 64, 192), 0.0, 1.0, "grayscale captcha resized to height 64, pixel/255"),),
        realistic="a 64x192 grayscale captcha: light noisy background, dark strokes",
        notes="the default ddddocr OCR model: dynamically quantized (ConvInteger, MatMulInteger, DynamicQuantizeLSTM, "
              "com.microsoft ops) that QNN takes only in part; same output as common",
    ),
    CorpusModel(
        "ddddocr/common_det", "ddddocr==1.6.1", "ddddocr/common_det.onnx",
        "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6", 20127694,
        inputs=(_image("images", (1, 3, 416, 416), 0.0, 255.0, "BGR pixels 0-255 (not normalized), letterboxed with 114"),),
        realistic="a 416x416 image in 0..255: white with dark characters, grey (114) letterbox",
        notes="YOLOX click-captcha detector, static input; output (1, 3549, 6): box (4), objectness, class score",
    ),
    CorpusModel(
        "silero/silero_vad", "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3", 2327524,
        fix_shapes={"input": (1, 576), "state": (2, 1, 128)},
        inputs=(_SILERO_AUDIO, _SILERO_STATE, _SILERO_SR),
        realistic=_SILERO_REALISTIC,
        notes="load_silero_vad(onnx=True): the 8k/16k model; an If on sr selects one of two full sub-networks. Its dims "
              "are unnamed (input[?, ?], state[2, ?, 128]): --fix-shape. Pinned to 576 samples the dead 8 kHz branch no "
              "longer type-checks once ORT folds its shape Ifs: an NPU build must also freeze sr=16000. " + _SILERO_WHY,
    ),
    CorpusModel(
        "silero/silero_vad_16k_op15", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx",
        "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49", 1289603,
        fix_dims={"batch": 1, "sequence": 576},
        inputs=(_SILERO_AUDIO, _SILERO_STATE, _SILERO_SR),
        realistic=_SILERO_REALISTIC,
        notes="load_silero_vad(onnx=True, opset_version=15): 16 kHz only (the wrapper warns). " + _SILERO_WHY,
    ),
    CorpusModel(
        "silero/silero_vad_16k_sequence", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx",
        "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85", 1246165,
        fix_dims={"sequence_length": _SEQUENCE_FRAMES},
        inputs=(
            InputHint("input", "audio", "float32", (_SEQUENCE_FRAMES, 576), low=-1.0, high=1.0, value=16000,
                      note="a block of frames, each 64 context + 512 samples at 16 kHz (sequence_vad.frame_blocks)"),
            InputHint("h", "state", "float32", (1, 1, 128), low=-1.0, high=1.0, note="LSTM h: zeros, then the previous hn"),
            InputHint("c", "state", "float32", (1, 1, 128), low=-1.0, high=1.0, note="LSTM c: zeros, then the previous cn"),
        ),
        realistic=f"{_SEQUENCE_FRAMES} consecutive frames of a 440 Hz sine (+ harmonics) with 1% noise, zero h and c",
        notes="load_silero_vad(sequence=True): SileroVADSequence runs blocks of up to max_frames=512 frames per call "
              f"(the last block shorter); an NPU build fixes the block: {_SEQUENCE_FRAMES} frames (~2 s), pad the last block. "
              "512 frames compiles (50 s on the HTP simulator) but the fp16 LSTM state drifts (cn SNR ~10 dB)",
    ),
    CorpusModel(
        "silero/silero_vad_half", "silero-vad==6.2.3", "silero_vad/data/silero_vad_half.onnx",
        "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769", 1280395,
        fix_dims={"batch": 1, "sequence": 576},
        inputs=(_SILERO_AUDIO, _SILERO_STATE),
        realistic="a 440 Hz sine (+ harmonics) with 1% noise at 16 kHz, zero state",
        notes="a 16 kHz variant without the sr input (not loaded by the package's own code; fp32 weights despite the "
              "name); fed like the others",
    ),
    CorpusModel(
        "silero/silero_vad_op18_ifless", "silero-vad==6.2.3", "silero_vad/data/silero_vad_op18_ifless.onnx",
        "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28", 2845718,
        fix_dims={"batch": 1, "sequence": 576},
        inputs=(_SILERO_AUDIO, _SILERO_SR, _SILERO_STATE),
        realistic=_SILERO_REALISTIC,
        notes="an opset-18 export whose top level is one If on sr (8k / 16k branches) reading main-graph initializers, "
              "which ORT 1.31's EPContext writer drops (onnxruntime#32131): an NPU build must freeze sr=16000; not "
              "loaded by the package's code",
    ),
    CorpusModel(
        "silero/silero_vad_openvino_16k", "silero-vad==6.2.3", "silero_vad/data/silero_vad_openvino_16k.onnx",
        "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87", 1288203,
        inputs=(_SILERO_AUDIO, _SILERO_STATE),
        realistic="a 440 Hz sine (+ harmonics) with 1% noise at 16 kHz, zero state",
        notes="static shapes already (input[1, 576], state[2, 1, 128]); 16 kHz, no sr input",
    ),
    CorpusModel(
        "rxnmap/rxnmap", "chython-rxnmap==2.0", "chython_rxnmap/rxnmap.onnx",
        "a4c60aba5c3524dda96ea3af9e1487d3fb09a4e376604e506b1f0064cfcef2e0", 84767063,
        fix_dims={"seq_len": 64},
        inputs=(
            InputHint("atoms", "index", "int64", (1, 64), low=0, high=121,
                      note="0 padding, 1 molecule CLS, atomic number + 2 (Gather on atoms_encoder.weight[121, 1024])"),
            InputHint("neighbors", "index", "int64", (1, 64), low=0, high=17,
                      note="0 CLS/padding, neighbour count incl. implicit H + 2, capped at 14 + 2 (table [17, 1024])"),
            InputHint("distances", "index", "int64", (1, 64, 64), low=0, high=13,
                      note="0 padding/other molecule, 1 CLS or unreachable, shortest path + 2 capped at 10 + 2 (table [13, 16])"),
            InputHint("roles", "index", "int64", (1, 64), low=0, high=4,
                      note="0 molecule CLS and padding (masked with -inf), 1 reaction CLS, 2 reactant atom, 3 product atom"),
        ),
        realistic="ethanol + acetic acid >> ethyl acetate + water (19 tokens), encoded as chython does, padded to 64 tokens",
        notes="chython's attention atom mapping (chython/algorithms/attention.py) feeds one reaction, seq_len = 1 + "
              "molecules + heavy atoms; an NPU build pads to a fixed 64 (see encode_reaction: an all-zero padding row of "
              "distances gives NaN everywhere). Output (seq_len, seq_len) attention",
    ),
    CorpusModel(
        "magika/standard_v3_3", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx",
        "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c", 3163737,
        fix_dims={"unk__214": 1},
        inputs=(InputHint("bytes", "index", "int32", (1, 2048), low=0, high=257,
                          note="the first 1024 bytes (after lstrip) and the last 1024 (after rstrip) of a file, 256 pads a short one"),),
        realistic="a ~3 KB Python-like source file's bytes, taken as magika does (beginning and end, no padding)",
        notes="magika's content-type model (magika.py _extract_features_from_seekable: beg_size=end_size=1024, padding "
              "token 256, config.min.json); output (1, 214) probabilities. QNN publishes it on the check's generated ids "
              "(uniform bytes agree at 66-70 dB) and gets a text file wrong (-122.9 dB: a LayerNorm's sum of squares "
              "passes 65504 in fp16); with the file as --inputs the check refuses it and --fallback auto fixes it",
        qnn_extra=(("--inputs", REALISTIC_FILE), ("--inputs", REALISTIC_FILE, "--fallback", "auto")),
    ),
    CorpusModel(
        "nudenet/320n", "nudenet==3.4.2", "nudenet/320n.onnx",
        "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f", 12150158,
        fix_dims={"batch": 1, "height": 320, "width": 320},
        inputs=(_image("images", (1, 3, 320, 320), 0.0, 1.0, "RGB pixel/255, padded to a square (black bottom/right), resized to 320"),),
        realistic="a 240x320 photo-like image (smooth background, skin-toned blobs) padded black to 320x320, /255",
        notes="NudeDetector (nudenet.py _read_image: copyMakeBorder to a square, blobFromImage 1/255 at 320, swapRB); "
              "output (1, 22, 2100): 4 box values and 18 class scores per anchor",
    ),
    CorpusModel(
        "whisper/silero_vad_v6", "faster-whisper==1.2.1", "faster_whisper/assets/silero_vad_v6.onnx",
        "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2", 1245151,
        fix_dims={"seq_len": _SEQUENCE_FRAMES},
        inputs=(
            InputHint("input", "audio", "float32", (_SEQUENCE_FRAMES, 576), low=-1.0, high=1.0, value=16000,
                      note="frames of 64 context + 512 samples at 16 kHz (faster_whisper/vad.py SileroVADModel)"),
            InputHint("h", "state", "float32", (1, 1, 128), low=-1.0, high=1.0, note="LSTM h: zeros (one call per audio)"),
            InputHint("c", "state", "float32", (1, 1, 128), low=-1.0, high=1.0, note="LSTM c: zeros"),
        ),
        realistic=f"{_SEQUENCE_FRAMES} consecutive frames of a 440 Hz sine (+ harmonics) with 1% noise, zero h and c",
        notes="faster-whisper's VAD filter runs every frame of the audio in one call (up to 10000 frames); an NPU build "
              f"fixes the block at {_SEQUENCE_FRAMES} frames (~2 s) and carries h, c between blocks",
    ),
]


def models() -> list[CorpusModel]:
    """The pinned models (paths not resolved; see ensure_corpus)."""
    return list(_MODELS)


# ---------------------------------------------------------------- fetching


class CorpusError(RuntimeError):
    """The corpus is wrong: a pin does not match what was downloaded, or a wheel holds an unpinned model."""


class CorpusUnavailable(CorpusError):
    """The corpus cannot be downloaded here (no network, no pip, no index): tests skip unless CI is set."""


@dataclass
class FetchReport:
    models: list[CorpusModel]
    downloaded: list[str] = field(default_factory=list)  # wheel file names fetched from the index
    extracted: list[str] = field(default_factory=list)  # model ids written from a wheel
    seconds: float = 0.0


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/ortcompile-tests/corpus`` (default ``~/.cache/...``), read at call time."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / CACHE_SUBDIR


def _model_file(model: CorpusModel, root: Path) -> Path:
    """ROOT/models/<alias>/<name>.onnx"""
    alias, name = model.id.split("/", 1)
    return root / "models" / alias / f"{name}.onnx"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verified(path: Path, sha256: str, size: int | None = None) -> bool:
    try:
        if size is not None and path.stat().st_size != size:
            return False
        return sha256_file(path) == sha256
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """An exclusive lock on ROOT/.lock for the whole fetch: concurrent fetchers wait, then find the files there."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a+b") as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _download(wheel: Wheel, root: Path) -> Path:
    """pip-download one pinned wheel into ROOT/wheels (temp directory, verify, rename)."""
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=root))
    try:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", wheel.requirement,
                   "-d", str(tmp), "--quiet", "--progress-bar", "off", "--disable-pip-version-check",
                   "--retries", "1", "--timeout", "30"]
        try:
            child = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CorpusUnavailable(f"cannot download {wheel.requirement}: {exc}") from exc
        if child.returncode != 0:
            lines = [line.strip() for line in (child.stderr + child.stdout).splitlines() if line.strip()]
            raise CorpusUnavailable(f"cannot download {wheel.requirement}: pip exited {child.returncode}: "
                                    + (lines[-1] if lines else "no message"))
        got = tmp / wheel.filename
        if not got.is_file():
            raise CorpusError(f"pip downloaded {sorted(p.name for p in tmp.iterdir())} for {wheel.requirement}, "
                              f"expected {wheel.filename}")
        digest = sha256_file(got)
        if digest != wheel.sha256:
            raise CorpusError(f"{wheel.filename}: sha256 {digest} does not match the pin {wheel.sha256} "
                              "(a changed upload or a corrupted download)")
        target = wheels / wheel.filename
        os.replace(got, target)
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _extract(wheel: Wheel, wheel_path: Path, wanted: list[CorpusModel], root: Path) -> None:
    """Write each wanted model from the wheel under a temp name, check its pin, rename it into place."""
    with zipfile.ZipFile(wheel_path) as archive:
        members = {info.filename for info in archive.infolist() if info.filename.endswith(".onnx")}
        pinned = {m.member for m in _MODELS if m.package == wheel.requirement}
        unpinned = sorted(members - pinned)
        if unpinned:
            raise CorpusError(f"{wheel_path.name} holds .onnx files without a pin in tests/corpus.py: {unpinned}")
        for model in wanted:
            target = _model_file(model, root)
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            try:
                digest = hashlib.sha256()
                with os.fdopen(fd, "wb") as out, archive.open(model.member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):  # noqa: B023 - consumed within the iteration
                        digest.update(block)
                        out.write(block)
                if digest.hexdigest() != model.sha256:
                    raise CorpusError(f"{model.id}: sha256 {digest.hexdigest()} in {wheel_path.name} does not match the pin {model.sha256}")
                os.replace(tmp_name, target)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp_name)


def fetch(root: Path | None = None, packages: Iterable[str] | None = None) -> FetchReport:
    """Make the corpus (or the models of PACKAGES, e.g. ``["silero-vad"]``) present and verified under ROOT.

    Raises CorpusUnavailable when a needed wheel cannot be downloaded, CorpusError when a pin does not match.
    """
    start = time.monotonic()
    root = Path(root) if root is not None else cache_dir()
    selected = list(WHEELS) if packages is None else [p.split("==")[0] for p in packages]
    unknown = [p for p in selected if p not in WHEELS]
    if unknown:
        raise ValueError(f"not a corpus package: {unknown}; known: {sorted(WHEELS)}")
    report = FetchReport(models=[])
    with _locked(root):
        for name in selected:
            wheel = WHEELS[name]
            group = [m for m in _MODELS if m.package == wheel.requirement]
            missing = [m for m in group if not _verified(_model_file(m, root), m.sha256, m.size)]
            if missing:
                wheel_path = root / "wheels" / wheel.filename
                if not _verified(wheel_path, wheel.sha256):
                    wheel_path = _download(wheel, root)
                    report.downloaded.append(wheel.filename)
                _extract(wheel, wheel_path, missing, root)
                report.extracted += [m.id for m in missing]
            report.models += [_resolved(m, root) for m in group]
    report.seconds = time.monotonic() - start
    return report


def _resolved(model: CorpusModel, root: Path) -> CorpusModel:
    return CorpusModel(**{**model.__dict__, "path": _model_file(model, root)})


def ensure_corpus(root: Path | None = None) -> list[CorpusModel]:
    """All 16 models, present and verified (downloading what is missing); ``model.path`` is set."""
    return fetch(root).models


_REQUIRED: list[CorpusModel] | BaseException | None = None


def required_in_ci() -> bool:
    return bool(os.environ.get("CI"))


def require_corpus() -> list[CorpusModel]:
    """For tests: the corpus, or a skip (a fail when ``CI`` is set) saying why it cannot be downloaded.

    The result (or the failure) is remembered for the process, so an offline run pays the pip timeout once.
    A pin mismatch (CorpusError) always fails: that is a wrong corpus, not a missing one.
    """
    import pytest

    global _REQUIRED
    if _REQUIRED is None:
        try:
            _REQUIRED = ensure_corpus()
        except CorpusError as exc:
            _REQUIRED = exc
    if isinstance(_REQUIRED, CorpusUnavailable):
        if required_in_ci():
            pytest.fail(f"CI is set but the real-model corpus cannot be downloaded: {_REQUIRED}", pytrace=False)
        pytest.skip(f"real-model corpus unavailable (no download possible): {_REQUIRED}")
    if isinstance(_REQUIRED, BaseException):
        pytest.fail(f"real-model corpus is wrong: {_REQUIRED}", pytrace=False)
    return _REQUIRED


def require_model(model_id: str) -> CorpusModel:
    return next(m for m in require_corpus() if m.id == model_id)


# ---------------------------------------------------------------- inputs


def make_inputs(model: CorpusModel, kind: str = "realistic", seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for MODEL at its pinned shapes.

    kind ``realistic``: synthetic but plausible data (text-like images, a sine at 16 kHz, an encoded reaction);
    ``uniform``: floats uniform in [-1, 1]; ``normal``: standard normal floats. In the two random kinds, ``constant``
    inputs keep their value (silero's sr=16000) and ``index`` inputs stay inside their table.
    """
    rng = np.random.default_rng(seed)
    if kind == "realistic":
        return _REALISTIC[model.id.split("/")[0]](model, rng)
    if kind not in ("uniform", "normal"):
        raise ValueError(f"kind must be realistic, uniform or normal, not {kind!r}")
    feeds: dict[str, np.ndarray] = {}
    for h in model.inputs:
        if h.kind == "constant":
            feeds[h.name] = np.array(h.value, dtype=h.dtype).reshape(h.shape)
        elif h.kind == "index":
            feeds[h.name] = rng.integers(int(h.low or 0), int(h.high or 1), size=h.shape).astype(h.dtype)
        elif kind == "uniform":
            feeds[h.name] = rng.uniform(-1.0, 1.0, size=h.shape).astype(h.dtype)
        else:
            feeds[h.name] = rng.standard_normal(size=h.shape).astype(h.dtype)
    return feeds


def _stroke(canvas: np.ndarray, p0: tuple[float, float], p1: tuple[float, float], width: float, ink: Any) -> None:
    """Draw a thick line segment (y, x) -> (y, x) onto an HxW[xC] canvas."""
    steps = int(max(abs(p1[0] - p0[0]), abs(p1[1] - p0[1])) * 2) + 1
    r = max(int(width // 2), 0)
    height, width_px = canvas.shape[:2]
    for t in np.linspace(0.0, 1.0, steps):
        y = int(round(p0[0] + (p1[0] - p0[0]) * t))
        x = int(round(p0[1] + (p1[1] - p0[1]) * t))
        canvas[max(y - r, 0):min(y + r + 1, height), max(x - r, 0):min(x + r + 1, width_px)] = ink


def text_image(height: int, width: int, rng: np.random.Generator, *, lines: int = 1, channels: int = 3,
               background: int = 255, noise: float = 0.0) -> np.ndarray:
    """A uint8 HxWxC image: a light background with LINES rows of dark, character-sized stroke groups."""
    canvas = np.full((height, width, channels), background, dtype=np.float32)
    if noise:
        canvas += rng.normal(0.0, noise, size=canvas.shape)
    line_h = height / lines
    for row in range(lines):
        top = row * line_h + line_h * 0.2
        glyph_h = line_h * 0.6
        glyph_w = glyph_h * 0.7
        x = rng.uniform(0.03, 0.1) * width
        end = width * (0.97 if lines == 1 else rng.uniform(0.5, 0.95))
        while x + glyph_w < end:
            ink = rng.uniform(0, 70, size=channels)
            stroke_w = max(glyph_h / 8, 1.0)
            for _ in range(int(rng.integers(2, 5))):
                y0, y1 = top + rng.uniform(0, glyph_h, size=2)
                x0, x1 = x + rng.uniform(0, glyph_w, size=2)
                _stroke(canvas, (y0, x0), (y1, x1), stroke_w, ink)
            x += glyph_w * rng.uniform(1.05, 1.4)
    return np.clip(canvas, 0, 255).astype(np.uint8)


def _normalized_chw(image: np.ndarray) -> np.ndarray:
    """PaddleOCR normalization: (pixel/255 - 0.5)/0.5, HWC -> 1xCxHxW."""
    x = (image.astype(np.float32) / 255.0 - 0.5) / 0.5
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def _rapidocr_inputs(model: CorpusModel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    _, _, h, w = model.hint("x").shape
    if model.name.startswith("ch_PP-OCRv4_det"):
        return {"x": _normalized_chw(text_image(h, w, rng, lines=max(h // 80, 1)))}
    text_w = int(w * rng.uniform(0.6, 0.9))  # a text line, right-padded with 0 as rapidocr does
    x = np.zeros((1, 3, h, w), dtype=np.float32)
    x[..., :text_w] = _normalized_chw(text_image(h, text_w, rng))
    return {"x": x}


def _ddddocr_inputs(model: CorpusModel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    hint = model.inputs[0]
    if model.name == "common_det":
        _, _, h, w = hint.shape
        canvas = np.full((h, w, 3), 114, dtype=np.uint8)  # letterbox: a 3:2 image scaled into the square
        image_h = int(h * 2 / 3)
        canvas[:image_h] = text_image(image_h, w, rng, lines=2, background=235, noise=12.0)
        return {hint.name: np.ascontiguousarray(canvas.transpose(2, 0, 1)[None].astype(np.float32))}
    _, _, h, w = hint.shape
    gray = text_image(h, w, rng, channels=1, background=225, noise=15.0)[..., 0]
    return {hint.name: (gray.astype(np.float32) / 255.0)[None, None]}


def speech_like(samples: int, rng: np.random.Generator, rate: int = 16000, start: int = 0) -> np.ndarray:
    """A 440 Hz tone with two harmonics and 1% noise, amplitude ~0.5, float32 in [-1, 1]."""
    t = (np.arange(samples) + start) / rate
    tone = 0.3 * np.sin(2 * math.pi * 440 * t) + 0.15 * np.sin(2 * math.pi * 880 * t) + 0.05 * np.sin(2 * math.pi * 1320 * t)
    return np.clip(tone + 0.01 * rng.standard_normal(samples), -1, 1).astype(np.float32)


def _silero_inputs(model: CorpusModel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    for h in model.inputs:
        if h.kind == "constant":
            feeds[h.name] = np.array(h.value, dtype=h.dtype)
        elif h.kind == "state":
            feeds[h.name] = np.zeros(h.shape, dtype=h.dtype)
        else:  # frames of 64 context + 512 new samples, each frame's context the previous frame's tail
            frames, width = h.shape
            audio = speech_like(frames * 512 + 64, rng)
            feeds[h.name] = np.stack([audio[i * 512:i * 512 + width] for i in range(frames)]).astype(h.dtype)
    return feeds


# heavy atoms (atomic number, implicit H) and bonds of small molecules, as chython sees them
_MOLECULES = {
    "ethanol": ([(6, 3), (6, 2), (8, 1)], [(0, 1), (1, 2)]),
    "acetic acid": ([(6, 3), (6, 0), (8, 0), (8, 1)], [(0, 1), (1, 2), (1, 3)]),
    "ethyl acetate": ([(6, 3), (6, 0), (8, 0), (8, 0), (6, 2), (6, 3)], [(0, 1), (1, 2), (1, 3), (3, 4), (4, 5)]),
    "water": ([(8, 2)], []),
}


def encode_reaction(reactants: list[str], products: list[str], seq_len: int) -> dict[str, np.ndarray]:
    """chython's attention-mapping encoding (rxn CLS, then per molecule its CLS and atoms), padded to SEQ_LEN.

    Padding tokens are atoms=neighbors=roles=0 with a distance-1 self-loop: the real tokens' outputs are then exactly
    those of the unpadded reaction (chython itself never pads; a fixed-shape NPU build must).
    """
    atoms, neighbors, roles, blocks = [0], [0], [1], []
    for role, names in ((2, reactants), (3, products)):
        for name in names:
            heavy, bonds = _MOLECULES[name]
            n = len(heavy)
            degree = [h for _, h in heavy]
            for a, b in bonds:
                degree[a] += 1
                degree[b] += 1
            atoms += [1] + [z + 2 for z, _ in heavy]
            neighbors += [0] + [min(d, 14) + 2 for d in degree]
            roles += [0] + [role] * n
            dist = np.full((n, n), np.inf)
            np.fill_diagonal(dist, 0)
            for a, b in bonds:
                dist[a, b] = dist[b, a] = 1
            for k in range(n):  # Floyd-Warshall
                dist = np.minimum(dist, dist[:, k:k + 1] + dist[k:k + 1, :])
            dist[np.isinf(dist)] = 1  # chython: unreachable -> 1, then the +2 shift
            block = np.ones((n + 1, n + 1), dtype=np.int64)
            block[1:, 1:] = np.minimum(dist, 10) + 2
            blocks.append(block)
    total = len(atoms)
    if total > seq_len:
        raise ValueError(f"the reaction needs {total} tokens, more than seq_len={seq_len}")
    distances = np.zeros((seq_len, seq_len), dtype=np.int64)
    distances[0, 0] = 1
    # padding: spatial_encoder.weight[0] is -inf (distance 0 = "do not attend"), so a padding token whose row is all
    # 0 turns into NaN that spreads to every output; a self-loop (1) keeps it finite and unseen by the real tokens
    distances[np.arange(total, seq_len), np.arange(total, seq_len)] = 1
    i = 1
    for block in blocks:
        distances[i:i + len(block), i:i + len(block)] = block
        i += len(block)
    pad = [0] * (seq_len - total)
    return {
        "atoms": np.array([atoms + pad], dtype=np.int64),
        "neighbors": np.array([neighbors + pad], dtype=np.int64),
        "distances": distances[None],
        "roles": np.array([roles + pad], dtype=np.int64),
    }


def _rxnmap_inputs(model: CorpusModel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return encode_reaction(["ethanol", "acetic acid"], ["ethyl acetate", "water"], model.hint("atoms").shape[1])


_WORDS = ("def", "return", "self", "value", "items", "for", "in", "if", "not", "None", "import", "numpy", "path", "name", "model")


def source_text(rng: np.random.Generator, size: int = 3000) -> bytes:
    """Python-like source code of about SIZE bytes: imports, then functions of short indented statements."""
    lines = ["import os", "import sys", "from pathlib import Path", ""]
    while sum(len(line) + 1 for line in lines) < size:
        name = "_".join(rng.choice(_WORDS, 2))
        lines += [f"def {name}(path, value=None):", f'    """{" ".join(rng.choice(_WORDS, 6))}."""']
        for _ in range(int(rng.integers(2, 6))):
            lines.append(f"    {rng.choice(_WORDS)} = {rng.choice(_WORDS)}.{rng.choice(_WORDS)}({int(rng.integers(0, 100))})")
        lines += [f"    return {rng.choice(_WORDS)}", ""]
    return "\n".join(lines).encode()


def magika_features(content: bytes, size: int = 1024, padding: int = 256) -> np.ndarray:
    """magika's features: the first SIZE bytes after lstrip (padded after), the last SIZE after rstrip (padded before)."""
    begin, end = list(content.lstrip()[:size]), list(content.rstrip()[-size:])
    return np.array([begin + [padding] * (size - len(begin)) + [padding] * (size - len(end)) + end], dtype=np.int32)


def _magika_inputs(model: CorpusModel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"bytes": magika_features(source_text(rng))}


def photo_like(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """An HxWx3 float image in [0, 1]: a smooth two-colour background with a few soft skin-toned ellipses."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    top, bottom = rng.uniform(0.3, 0.9, 3), rng.uniform(0.1, 0.6, 3)
    image = top + (bottom - top) * (y / height)[..., None]
    for _ in range(int(rng.integers(2, 5))):
        cy, cx = rng.uniform(0.2, 0.8) * height, rng.uniform(0.2, 0.8) * width
        ry, rx = rng.uniform(0.1, 0.3) * height, rng.uniform(0.05, 0.2) * width
        weight = np.clip(1.5 - ((y - cy) / ry) ** 2 - ((x - cx) / rx) ** 2, 0, 1)[..., None]
        image = image * (1 - weight) + np.array([0.85, 0.64, 0.52]) * rng.uniform(0.7, 1.1) * weight
    return np.clip(image + rng.normal(0, 0.01, image.shape), 0, 1).astype(np.float32)


def _nudenet_inputs(model: CorpusModel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    _, _, side, _ = model.hint("images").shape
    canvas = np.zeros((side, side, 3), dtype=np.float32)  # padded to a square with black, as nudenet does
    canvas[:, : side * 3 // 4] = photo_like(side, side * 3 // 4, rng)
    return {"images": np.ascontiguousarray(canvas.transpose(2, 0, 1)[None])}


_REALISTIC = {"rapidocr": _rapidocr_inputs, "ddddocr": _ddddocr_inputs, "silero": _silero_inputs, "rxnmap": _rxnmap_inputs,
              "magika": _magika_inputs, "nudenet": _nudenet_inputs, "whisper": _silero_inputs}


# ---------------------------------------------------------------- command line


def _describe(model: CorpusModel, root: Path) -> dict[str, Any]:
    path = _model_file(model, root)
    return {
        "id": model.id, "package": model.package, "path": str(path), "present": path.is_file(), "sha256": model.sha256,
        "size": model.size, "fix_dims": model.fix_dims, "fix_shapes": {k: list(v) for k, v in model.fix_shapes.items()},
        "cli_pins": model.cli_pins(),
        "inputs": [{k: v for k, v in {**h.__dict__, "shape": list(h.shape)}.items() if v not in (None, "")} for h in model.inputs],
        "realistic": model.realistic, "notes": model.notes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/corpus.py", description="The real-model test corpus (pinned PyPI wheels).")
    parser.add_argument("--cache", type=Path, default=None, help=f"corpus directory (default {cache_dir()})")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch_p = sub.add_parser("fetch", help="download, verify and extract what is missing")
    fetch_p.add_argument("--package", action="append", choices=sorted(WHEELS), help="only this package (repeatable)")
    list_p = sub.add_parser("list", help="the models, their pins and input hints")
    list_p.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    root = args.cache or cache_dir()
    if args.command == "fetch":
        try:
            report = fetch(root, args.package)
        except CorpusError as exc:
            print(f"corpus: error: {exc}", file=sys.stderr)
            return 3 if isinstance(exc, CorpusUnavailable) else 1
        print(f"{len(report.models)} models verified in {root} ({report.seconds:.1f}s); "
              f"downloaded {len(report.downloaded)} wheels, extracted {len(report.extracted)} models")
        for m in report.models:
            print(f"  {m.id:40} {m.size / 2**20:7.1f} MiB  {' '.join(m.cli_pins()) or '(static)'}")
        return 0
    described = [_describe(m, root) for m in _MODELS]
    if args.json:
        print(json.dumps(described, indent=2))
    else:
        for d in described:
            print(f"{d['id']:40} {'present' if d['present'] else 'missing':8} {' '.join(d['cli_pins']) or '(static)'}")
            for h in d["inputs"]:
                print(f"    {h['name']}: {h['kind']} {h['dtype']}{h['shape']}  {h.get('note', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What ONNX Runtime's and the EPs' texts mean: every substring or pattern ortcompile matches against them, in one table.

ORT and the EP plugins report failures as text only (one exception type, a status word, a message), so the
meaning is in the words. Each marker below says which text it is found in, what it means and who reads it;
measured with onnxruntime 1.31 and onnxruntime-qnn 2.7 unless noted. A leaf: imports nothing, so every floor
may read it.
"""

from __future__ import annotations

import re

# --- exception texts of ORT (status header, source location, cause) -------------------------------------------------

# "[ONNXRuntimeError] : 1 : FAIL : " before every message: dropped from the one-line reason (errors.ort_reason).
ORT_STATUS = re.compile(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*[A-Z_]+\s*:\s*")
# "onnx_graph.cc:123 Fn " after it: where in ORT's sources it was raised, no help to a user (errors.ort_reason); also
# anywhere in the text with the C++ function's whole signature ("/onnxruntime_src/.../model.cc:256
# onnxruntime::Model::Model(onnx::ModelProto&&, ...) Unsupported model IR version: 14, ...", "...Locale(const
# std::string&)::<lambda()> Failed to construct locale ...").
SOURCE_LOCATION = re.compile(r"^\S+\.(?:cc|cpp|h|hpp):\d+\s+(?:\S+\s+)?(?=[A-Z\[])")
SOURCE_SIGNATURE = re.compile(r"\S+\.(?:cc|cpp|h|hpp):\d+\s+[^()]*\([^()]*\)(?:::<lambda\(\)>)?\s+(?=\S)")
# "Load model from PATH failed:" before the cause: the message that carries it names the model already.
LOAD_FAILED = re.compile(r"^Load model from .*? failed:\s*")
# "Load model from X failed: ... In Node, (...) , Error <cause>": the cause is what follows (errors.ort_reason).
CAUSE_SEPARATOR = ", Error "

# --- the Compile API (compile/ortstep.py, compile/blobs.py) ---------------------------------------------------------

# ERROR_IF_NO_NODES_COMPILED fired: the EP took none of the graph (NothingCompiled, exit 1).
NOTHING_COMPILED = "Unable to compile any nodes"
# ORT's layout transform rewrote an op into NHWC for the EP, which then did not take it: the op type (QNN 2.7.0 on
# MaxPool/AveragePool with ceil_mode, 3-D GridSample, Upsample: ONNX's node tests).
LAYOUT_REFUSED = re.compile(r"OpType:(\w+) with domain:com\.ms\.internal\.nhwc was inserted using the NHWC format as requested by \w+, "
                            r"but was not selected by that EP")
# The EP has no EPContext data write callback: compile again letting the EP write its blob files itself.
CALLBACK_UNSUPPORTED = "does not support the registered EPContext data write callback"
# Status codes and messages that mean the input model itself is broken (exit 3), not the EP (exit 1) — when the
# CPU EP cannot load the source either.
INVALID_MODEL = (" : INVALID_GRAPH : ", " : INVALID_PROTOBUF : ", " : NO_SUCHFILE : ", "This is an invalid model", "Load model from")

# --- session creation (run/sessions.py) -----------------------------------------------------------------------------

# A session that fails with one of these could not read the model file at all: InvalidModel (exit 3), not a
# compile failure.
UNREADABLE_MODEL = ("ModelProto", "rotobuf", "No such file", "doesn't exist", "does not exist", "NO_SUCHFILE")

# --- EP registration (eps/registry.py) ------------------------------------------------------------------------------

# register_execution_provider_library for a name this process registered before: nothing to do.
ALREADY_REGISTERED = "already registered"

# --- the pre-publish check's load failures (readback/parity.py) -----------------------------------------------------

# (any of these substrings, what it likely means): the hint a compiled model that does not load is refused with.
LIKELY_CAUSES = (
    (("count of graph inputs should be at least the count of tensor_wrapper", "zero graph inputs is not supported"),
     "the EP took only shape-computation partitions, or a partition reads an initializer also listed as a graph input: pin "
     "the dynamic dims with --fix-dim/--fix-shape and keep the prepare step (it compiles such inputs as constants)"),
    (("single static assignment",),
     "ONNX Runtime's Compile API wrote subgraphs it cannot load again (If/Loop bodies left on the CPU EP); try --no-prepare or --ep cpu"),
)

# --- a library the loader could not open (eps/diagnose.py) ----------------------------------------------------------

# "libcuda.so.1: cannot open shared object file" (Linux) and "xyz.dll ... could not be found" (Windows): the name.
CANNOT_OPEN_LIBRARY = re.compile(r"([A-Za-z0-9_.+-]+\.(?:so(?:\.\d+)*|dll|dylib))\"?\s*:\s*cannot open shared object file")
DLL_NOT_FOUND = re.compile(r"([A-Za-z0-9_.+-]+\.dll)\b.*(?:could not be found|not found)", re.IGNORECASE)

# --- ORT's log (what native code prints on fd 2) --------------------------------------------------------------------

# One log record: "2026-... [W:onnxruntime:Default, qnn_backend.cc:123 Fn] message" (native.clean_native_line).
ORT_LOG_LINE = re.compile(r"^\S+ \S+ \[(?P<severity>[VIWEF]):onnxruntime:[^,\]]*,? ?(?P<where>[^\]]*)\] (?P<message>.*)$")
# The same record read by the option probe, which needs the file and the function apart (eps/validate.py).
ORT_LOG_RECORD = re.compile(r"\[(?P<sev>[VIWEF]):onnxruntime:[^\]]*?,\s*(?P<where>\S+)\s+(?P<func>[^\]]*)\]\s?(?P<msg>.*)")
# A record of severity warning or worse, shown under -v by the placement report (readback/placement.py).
WARNING_OR_WORSE = ("[W:", "[E:", "[F:")
# Words of an EP log line that refuses a provider option value (QNN logs "Htp performance mode not valid." as a
# warning and carries on): the option probe turns such a line into a UsageError (eps/validate.py).
OPTION_REFUSAL = re.compile(r"invalid|not valid|unrecogni[sz]ed|malformed|failed|unsupported|not supported|cannot|can't|must |"
                            r"only one of|not allowed|out of range|expect", re.IGNORECASE)
# The QNN EP's verbose per-node refusals (readback/placement.refusal_reasons), a block of three lines:
#   ... LogNodeSupport] Validation FAILED for 1 nodes in OrtNodeUnit (Mod) :
#       Operator type: Mod Node name: m0 Node index: 2
#       REASON : QNN Mod Op only support fmod == 0 for now.
QNN_NODES_REFUSED = "Validation FAILED"
QNN_REFUSED_OPERATOR = re.compile(r"Operator type: (?P<op>\S+) Node name: ?(?P<name>.*?) Node index: ")
QNN_REFUSAL_REASON = re.compile(r"REASON ?: ?(?P<reason>.*\S)")
# Lines native libraries print on every run that say nothing about this model: shown under -v they bury what
# matters (native.clean_native_line drops them).
BOILERPLATE = (
    "File mapped weights feature is only available",
    "EPContext encryption config unavailable",
    "LIBNATIVE: No alternate configuration",
    "Rerunning with verbose output on a non-minimal build",
    "Some nodes were not assigned to the preferred execution providers",  # the placement report says which
    "Unable to get producer node for OrtValueInfo",  # ORT 1.31 plugin-EP graph API, on every CPU node between partitions
)


def likely_cause(text: str) -> str:
    """The LIKELY_CAUSES hint for a load failure's text, or ''."""
    for needles, cause in LIKELY_CAUSES:
        if any(n in text for n in needles):
            return cause
    return ""


def any_in(text: str, markers: tuple[str, ...]) -> bool:
    return any(marker in text for marker in markers)

"""Facts about ONNX protos: external-data references, tensor byte sizes, subgraphs, EPContext nodes, input shapes.

Every reader asks here instead of parsing fields by hand, so each rule is written once: what a missing
`length` means, how INT4 packs, which attribute says a blob is embedded, what a dim of -1 is. Nothing here
opens a file; `ortcompile.paths.resolve_inside` decides whether a location may be opened.

Readers come in two kinds: the compile path refuses a malformed model (`MalformedTensor`, a ValueError),
while `inspect` reports what it can (`lenient_external_ref`, `EpContextAttrs.problems`).

Importing this package does not import onnx (200 ms): modules on the CLI's light paths (`--help`,
`--if-changed`: graphpass, datapass, publish) may use it at top level. Functions that take a proto need
no import (the caller has onnx loaded); the few that need onnx's own code import it when called.

Three modules, every public name re-exported here (import from the package): `tensors` (data types, byte
sizes, external-data references), `graphs` (walking graphs, subgraphs and functions; inputs; op counts),
`epcontext` (EPContext node attributes and where their blobs live).
"""

from __future__ import annotations

from ortcompile.onnxfacts.epcontext import (  # noqa: F401
    EpContextAttrs,
    attribute,
    blob_files,
    blob_location,
    epcontext_attrs,
    epcontext_nodes,
    is_epcontext,
)
from ortcompile.onnxfacts.graphs import (  # noqa: F401
    GraphSite,
    TensorKind,
    TensorSite,
    cone,
    external_locations,
    graph_inputs,
    graph_tensor_names,
    input_dims,
    iter_graphs,
    iter_initializers,
    iter_tensors,
    op_counts,
    tiny_static_model,
)
from ortcompile.onnxfacts.tensors import (  # noqa: F401
    ATTR_GRAPH,
    ATTR_GRAPHS,
    ATTR_INT,
    ATTR_SPARSE_TENSOR,
    ATTR_SPARSE_TENSORS,
    ATTR_STRING,
    ATTR_TENSOR,
    ATTR_TENSORS,
    DATA_TYPES,
    EPCONTEXT,
    EXTERNAL,
    INT64_MAX,
    STRING,
    ExternalRef,
    MalformedTensor,
    dtype_name,
    element_bits,
    element_count,
    element_size,
    external_ref,
    inline_nbytes,
    is_external,
    lenient_external_ref,
    proto_text,
    stored_nbytes,
    tensor_nbytes,
)

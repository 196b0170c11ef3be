"""The catalogue: one explicit import per mechanism. Adding one = a new file here and one line below."""
from ..spec import MechanismSpec
from . import linear, linformer, local, performer, sdpa, sliding_window, softmax, sparse

MECHANISMS: dict[str, MechanismSpec] = {
    m.SPEC.key: m.SPEC for m in (softmax, sdpa, local, sparse, sliding_window, linformer, performer, linear)
}

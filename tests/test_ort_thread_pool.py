"""irpe.runtime.onnxruntime.session.share_thread_pool: one process-wide ONNX Runtime pool that every
session made afterwards shares. Run in fresh processes: the pool is process-wide and made once."""
import textwrap

from tests.helpers import run_python

SCRIPT = textwrap.dedent("""
    import os, sys
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from irpe.runtime.onnxruntime.session import create_session, session_options, share_thread_pool

    def threads():
        return len(os.listdir("/proc/self/task"))

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    data = model.SerializeToString()
    x = np.eye(64, dtype=np.float32)
    assert share_thread_pool(3) is True
    assert share_thread_pool(3) is True  # the same size again: still shared
    assert session_options(ort, 3).use_per_session_threads is False
    before = threads()
    sessions = [create_session(data, threads=3, custom_ops="off", quiet=True)[0]
                for _ in range(4)]
    for s in sessions:
        np.testing.assert_array_equal(s.run(None, {"x": x})[0], x)
    print("shared_growth", threads() - before)
    assert share_thread_pool(2) is False  # another size: the pool stays as it is
    before = threads()
    other = create_session(data, threads=2, custom_ops="off", quiet=True)[0]
    np.testing.assert_array_equal(other.run(None, {"x": x})[0], x)
    print("other_growth", threads() - before)
""")


def test_sessions_share_one_pool_made_once():
    done = run_python(["-c", SCRIPT], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    growth = dict(line.split() for line in done.stdout.splitlines() if "_growth" in line)
    assert int(growth["shared_growth"]) == 0  # four sessions, no new worker threads
    assert int(growth["other_growth"]) == 0  # ONNX Runtime allows no pool of its own now


UNSHARED = textwrap.dedent("""
    import os
    import onnxruntime as ort
    from irpe.runtime.onnxruntime.session import session_options
    options = session_options(ort, 2)
    assert options.use_per_session_threads is True and options.intra_op_num_threads == 2
    assert session_options(ort).intra_op_num_threads == 0  # ONNX Runtime's default
    print("ok")
""")


def test_without_a_shared_pool_sessions_get_their_own():
    done = run_python(["-c", UNSHARED], timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]

"""How a container gets its real GPUs, planned from made-up machines (astraeus.agent.runtime.gpu_edits)."""

from astraeus.agent.runtime import oci_spec
from astraeus.agent.runtime.gpu_edits import parse_ldconfig, plan_cdi, plan_device_nodes

CDI = {
    "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
    "devices": [{"name": str(i), "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]}} for i in range(4)]
    + [{"name": "GPU-abc", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia3"}]}}],
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
        "mounts": [{"hostPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54",
                    "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54", "options": ["ro", "bind"]}],
        "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk",
                   "args": ["nvidia-ctk", "hook", "update-ldcache"]}],
    },
}


def test_cdi_gives_the_assigned_gpus_and_the_common_edits_only():
    e = plan_cdi([{"kind": "other.com/x"}, CDI], [1, 2])
    assert e.source == "cdi"
    assert [d["path"] for d in e.devices] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1", "/dev/nvidia2"]
    assert e.binds == [("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54",) * 2 + (True,)]
    assert e.hooks["createContainer"][0]["args"][-1] == "update-ldcache"
    assert plan_cdi([CDI], [3], uuids={3: "GPU-abc"}).devices[-1]["path"] == "/dev/nvidia3"


def test_no_cdi_spec_for_a_gpu_falls_back_to_device_nodes():
    assert plan_cdi([CDI], [7]) is None
    assert plan_cdi([], [0]) is None


LDCONFIG = """\t4 libs found in cache `/etc/ld.so.cache'
\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1
\tlibcuda.so.1 (libc6) => /lib/i386-linux-gnu/libcuda.so.1
\tlibnvidia-ml.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1
"""


def test_device_nodes_and_driver_files_without_cdi():
    libs = parse_ldconfig(LDCONFIG)
    assert libs == [("libcuda.so.1", "/lib/x86_64-linux-gnu/libcuda.so.1"),
                    ("libnvidia-ml.so.1", "/lib/x86_64-linux-gnu/libnvidia-ml.so.1")]
    e = plan_device_nodes([2], {"/dev/nvidia0", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"}, libs,
                          {"nvidia-smi": "/usr/bin/nvidia-smi"})
    assert [d["path"] for d in e.devices] == ["/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert ("/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1", True) in e.binds
    assert ("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi", True) in e.binds
    env = oci_spec.with_path_prepended({"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"},
                                       e.path_prepend)
    assert env == {"PATH": "/usr/local/nvidia/bin:/usr/bin", "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}


def test_command_and_args_override_the_image_as_kubernetes_does():
    assert oci_spec.process_args("python", ["t.py"], ["/entry"], ["--help"]) == ["python", "t.py"]
    assert oci_spec.process_args("python", [], ["/entry"], ["--help"]) == ["python"]
    assert oci_spec.process_args(None, ["--x"], ["/entry"], ["--help"]) == ["/entry", "--x"]
    assert oci_spec.process_args(None, [], ["/entry"], ["--help"]) == ["/entry", "--help"]
    assert oci_spec.process_args(None, [], None, None) == []


def test_the_image_env_goes_under_the_workers_own():
    env = oci_spec.merge_env(["PATH=/opt/bin", "LANG=C.UTF-8", "bad"], {"LANG": "en_US.UTF-8", "X": "1"})
    assert env == {"PATH": "/opt/bin", "LANG": "en_US.UTF-8", "X": "1"}
    assert oci_spec.merge_env([], {})["PATH"] == oci_spec.DEFAULT_PATH

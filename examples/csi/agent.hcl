# Agent configuration for the CSI example (examples/csi/demo.sh): the plugin binary and
# the directory its volumes live in are host volumes handed to the plugin task.
data_dir = "/tmp/berth-csi/state"

host_volume "csi-bin" {
  path      = "/tmp/berth-csi/bin"
  read_only = true
}

host_volume "csi-data" {
  path = "/tmp/berth-csi/data"
}

csi {
  plugin_wait = "30s"
  # The hostpath plugin mounts volumes: its task, run by the csi-hostpath job (and no
  # other), may mount (as root, with CAP_SYS_ADMIN, bind mounts only).
  privileged_plugin "hostpath" {
    jobs = ["csi-hostpath"]
  }
}

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
  # The hostpath plugin mounts volumes, so its task keeps root's capabilities.
  privileged_plugins = ["hostpath"]
}

# `berth volume create examples/csi/volume.hcl`: CreateVolume through the plugin's
# controller, then registered in the catalog.
id           = "notes"
name         = "notes"
type         = "csi"
plugin_id    = "hostpath"
capacity_min = "10MiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

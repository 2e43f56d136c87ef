# The reference CSI plugin (tests/csi-hostpath) as an exec task. The supervisor hook
# mounts its socket dir at /csi and its staging root at /local/csi (bidirectional), sets
# CSI_ENDPOINT, probes it and registers it as node and controller ("monolith").
job "csi-hostpath" {
  group "plugin" {
    volume "bin" {
      type      = "host"
      source    = "csi-bin"
      read_only = true
    }

    volume "data" {
      type   = "host"
      source = "csi-data"
    }

    restart {
      attempts = 5
      delay    = "1s"
      interval = "5m"
      mode     = "fail"
    }

    task "plugin" {
      driver = "exec"

      config {
        command = "/opt/csi/csi-hostpath"
        args    = ["--data-dir", "/data"]
      }

      volume_mount {
        volume      = "bin"
        destination = "/opt/csi"
        read_only   = true
      }

      volume_mount {
        volume      = "data"
        destination = "/data"
      }

      csi_plugin {
        id             = "hostpath"
        type           = "monolith"
        mount_dir      = "/csi"
        health_timeout = "30s"
      }
    }
  }
}

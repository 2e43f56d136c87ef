job "notes-writer" {
  type = "batch"

  group "write" {
    volume "notes" {
      type            = "csi"
      source          = "notes"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }

    task "write" {
      driver = "exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "date > /notes/written-at; echo 'written through a CSI volume' >> /notes/written-at"]
      }

      volume_mount {
        volume      = "notes"
        destination = "/notes"
      }
    }
  }
}

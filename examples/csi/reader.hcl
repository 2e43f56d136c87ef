job "notes-reader" {
  type = "batch"

  group "read" {
    volume "notes" {
      type            = "csi"
      source          = "notes"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
      read_only       = true
    }

    task "read" {
      driver = "exec"

      config {
        command = "/bin/cat"
        args    = ["/notes/written-at"]
      }

      volume_mount {
        volume      = "notes"
        destination = "/notes"
      }
    }
  }
}

# raw_exec declares mount-configs "none": it cannot honour volume mounts. berth refuses
# this job at submit, naming the task, the driver and the volume:
#
#   berth job validate --config examples/agent.hcl examples/mount-config-error.hcl
job "db" {
  group "db" {
    volume "data" {
      type   = "host"
      source = "scratch"
    }

    task "db" {
      driver = "raw_exec"

      config {
        command = "/bin/sleep"
        args    = ["60"]
      }

      volume_mount {
        volume      = "data"
        destination = "/var/lib/db"
      }
    }
  }
}

# The README demo: an exec task in its own mount namespace and root (as nobody, exec's
# default user), with a host volume mounted read-only and another read-write.
#
#   berth run --config examples/agent.hcl examples/hello.hcl
job "hello" {
  type = "batch"

  group "greeter" {
    volume "greetings" {
      type      = "host"
      source    = "greetings"
      read_only = true
    }

    volume "scratch" {
      type   = "host"
      source = "scratch"
    }

    restart {
      attempts = 0
      mode     = "fail"
    }

    task "hello" {
      driver = "exec"

      config {
        command = "/bin/sh"
        args = ["-c", <<-EOT
          echo "hello from $NOMAD_TASK_NAME in alloc $NOMAD_ALLOC_ID"
          echo "the greeting volume says: $(cat /greetings/message.txt)"
          date -u +%FT%TZ > /scratch/last-run && echo "wrote /scratch/last-run"
          if touch /greetings/nope 2>/dev/null; then echo "read-only mount is writable!"; exit 1; fi
          echo "the read-only mount refused a write, as it should"
        EOT
        ]
      }

      volume_mount {
        volume      = "greetings"
        destination = "/greetings"
        read_only   = true
      }

      volume_mount {
        volume      = "scratch"
        destination = "/scratch"
      }
    }
  }
}

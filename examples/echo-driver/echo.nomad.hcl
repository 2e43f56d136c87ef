# A job for the echo driver: `berth run --config agent.hcl echo.nomad.hcl` prints the
# message twice in the task's log. Misspell `message` to see `job validate` refuse it.
job "echo" {
  type = "batch"

  group "hello" {
    restart {
      attempts = 0
      mode     = "fail"
    }

    task "say" {
      driver = "echo"

      config {
        message = "hello from my first berth driver"
        times   = 2
      }
    }
  }
}

# Agent configuration for the examples: two host volumes under /tmp/berth-demo.
data_dir = "/tmp/berth-demo/data"

host_volume "greetings" {
  path      = "/tmp/berth-demo/greetings"
  read_only = true
}

host_volume "scratch" {
  path = "/tmp/berth-demo/scratch"
}

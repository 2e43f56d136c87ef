# An agent that loads the drivers built here, besides its built-in ones.
#
#   sudo berth run --config agent.hcl echo.nomad.hcl
data_dir   = "/tmp/berth-echo/data"
plugin_dir = "target/wasm32-wasip2/release"

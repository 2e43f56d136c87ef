//! The host's network as tests reach a forwarded port: its address, and an HTTP GET
//! that waits for something to answer.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The host's first global IPv4 address on no interface whose line names one of
/// `excluding` (a test's own bridge), or `fallback` on a host without one (a bridge's
/// own address: the host's too, and forwards apply to it as to any other).
pub fn host_address(excluding: &[&str], fallback: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .expect("ip (iproute2) runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| !excluding.iter().any(|name| line.contains(name)))
        .find_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet")?;
            Some(words.next()?.split('/').next()?.to_string())
        })
        .unwrap_or_else(|| fallback.to_string())
}

/// The body of an HTTP/1.0 GET to `address` (`ip:port`), once something answers there;
/// panics after `within`.
pub fn http_get(address: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let answer = address
            .parse()
            .map_err(std::io::Error::other)
            .and_then(|to| TcpStream::connect_timeout(&to, Duration::from_secs(2)))
            .and_then(|mut stream| {
                stream.set_read_timeout(Some(Duration::from_secs(5)))?;
                stream.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
                let mut text = String::new();
                stream.read_to_string(&mut text)?;
                Ok(text)
            });
        match answer {
            Ok(text) if text.contains("\r\n\r\n") => {
                return text
                    .split_once("\r\n\r\n")
                    .map(|(_, body)| body.to_string())
                    .unwrap_or_default();
            }
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            other => panic!("nothing answered at {address}: {other:?}"),
        }
    }
}

//! Where the agent may fetch from. The agent is root on the host's network, so a job's
//! artifact could otherwise reach what only the host should: its loopback services (the
//! agent's own API, Consul, Vault), a cloud's metadata service at 169.254.169.254. The
//! operator's `denied_networks` (by default loopback, link-local, and 0.0.0.0/8, which
//! reaches loopback) are refused for every connection, a redirect's included: a name is
//! resolved by [`Guarded`], which drops the addresses denied, and an address written as
//! such is checked before it is asked.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;

/// An address range, `10.0.0.0/8` or `fe80::/10`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    address: IpAddr,
    prefix: u8,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a network (as \"127.0.0.0/8\" or \"fe80::/10\")")]
pub struct NetworkError(pub String);

impl std::str::FromStr for Network {
    type Err = NetworkError;

    fn from_str(text: &str) -> Result<Network, NetworkError> {
        let bad = || NetworkError(text.to_string());
        let (address, prefix) = text.split_once('/').ok_or_else(bad)?;
        let address: IpAddr = address.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        let bits = if address.is_ipv4() { 32 } else { 128 };
        if prefix > bits {
            return Err(bad());
        }
        Ok(Network { address, prefix })
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

impl Network {
    pub fn contains(&self, address: IpAddr) -> bool {
        // An IPv4 address in IPv6 clothes (::ffff:127.0.0.1) is the IPv4 address.
        let address = address.to_canonical();
        match (self.address, address) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Loopback, link-local (cloud metadata services), and 0.0.0.0/8 (which reaches
/// loopback).
pub fn default_denied() -> Arc<[Network]> {
    [
        "127.0.0.0/8",
        "0.0.0.0/8",
        "169.254.0.0/16",
        "::1/128",
        "::/128",
        "fe80::/10",
    ]
    .iter()
    .filter_map(|n| n.parse().ok())
    .collect()
}

/// The denied network `address` is in, if any.
pub fn denied_by(denied: &[Network], address: IpAddr) -> Option<Network> {
    denied.iter().copied().find(|n| n.contains(address))
}

/// A resolver that gives the connector only addresses outside the denied networks.
#[derive(Clone)]
pub struct Guarded {
    pub denied: Arc<[Network]>,
}

impl tower_service::Service<Name> for Guarded {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let denied = self.denied.clone();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| denied_by(&denied, a.ip()).is_none())
                .collect();
            match (allowed.is_empty(), found.first()) {
                (true, Some(first)) => Err(io::Error::other(format!(
                    "{} is {}, in {} (the agent's artifact denied_networks)",
                    name.as_str(),
                    first.ip(),
                    denied_by(&denied, first.ip()).map_or_else(String::new, |n| n.to_string())
                ))),
                _ => Ok(allowed.into_iter()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_hold_what_they_should() {
        let denied = default_denied();
        for inside in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "169.254.169.254",
            "::1",
            "::ffff:127.0.0.1",
            "fe80::1",
        ] {
            assert!(
                denied_by(&denied, inside.parse().unwrap()).is_some(),
                "{inside}"
            );
        }
        for outside in ["10.0.0.1", "93.184.216.34", "2001:db8::1", "128.0.0.1"] {
            assert!(
                denied_by(&denied, outside.parse().unwrap()).is_none(),
                "{outside}"
            );
        }
        assert!("10.0.0.0/33".parse::<Network>().is_err());
        assert!("nope".parse::<Network>().is_err());
        assert!(
            "0.0.0.0/0"
                .parse::<Network>()
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
    }
}

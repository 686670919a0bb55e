//! Address blocks in CIDR notation (`10.0.0.0/8`, `fd00::/8`, or one
//! address): the peers a listener takes PROXY protocol headers from.

use std::fmt;
use std::net::IpAddr;

/// An address block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// `addr/prefix`, or one address (all its bits).
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let net: IpAddr = (addr.trim().parse())
            .map_err(|_| format!("`{text}`: not an address block (e.g. 10.0.0.0/8)"))?;
        let bits = match net {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        let prefix = match prefix {
            None => bits,
            Some(p) => match p.trim().parse::<u8>() {
                Ok(p) if p <= bits => p,
                _ => return Err(format!("`{text}`: the prefix length is 0 to {bits}")),
            },
        };
        // An IPv4-mapped block (`::ffff:10.0.0.0/104`) as the IPv4 block
        // it is: peers are compared in their IPv4 form.
        match net.to_canonical() {
            IpAddr::V4(v4) if net.is_ipv6() && prefix >= 96 => Ok(Cidr {
                net: IpAddr::V4(v4),
                prefix: prefix - 96,
            }),
            IpAddr::V4(_) if net.is_ipv6() => Err(format!(
                "`{text}`: an IPv4-mapped block needs a prefix of 96 or more"
            )),
            _ => Ok(Cidr { net, prefix }),
        }
    }

    /// Whether `addr` is in the block (an IPv4-mapped IPv6 address, as a
    /// dual-stack socket reports an IPv4 peer, as its IPv4 address).
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.net, addr.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(addr)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(addr) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(addr)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(addr) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::Cidr;

    #[test]
    fn blocks_hold_their_addresses_and_no_others() {
        let ten = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(ten.contains("10.200.3.4".parse().unwrap()));
        assert!(!ten.contains("11.0.0.1".parse().unwrap()));
        // An IPv4 peer on a dual-stack socket.
        assert!(ten.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!ten.contains("fd00::1".parse().unwrap()));
        let one = Cidr::parse("192.0.2.7").unwrap();
        assert!(one.contains("192.0.2.7".parse().unwrap()));
        assert!(!one.contains("192.0.2.8".parse().unwrap()));
        let mapped = Cidr::parse("::ffff:10.0.0.0/104").unwrap();
        assert_eq!(mapped, ten);
        assert!(mapped.contains("::ffff:10.9.9.9".parse().unwrap()));
        assert!(Cidr::parse("::ffff:10.0.0.0/64").is_err());
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains("fdab::1".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        assert_eq!(v6.to_string(), "fd00::/8");
        for bad in ["10.0.0.0/33", "fd00::/129", "ten/8", "10.0.0.0/x", ""] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }
}

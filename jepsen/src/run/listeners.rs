//! Finds the port a node listens on from `/proc/net/tcp`, for runs without root: there each
//! node listens on its own loopback IP with a port the kernel picks (its cluster address is
//! its proxy's, and `keel serve` accepts any port with `--listen IP:0`). Knows nothing of
//! Keel or the proxy.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// The kernel's state code for a listening socket.
const TCP_LISTEN: &str = "0A";

/// The address listening on `ip` (any port) in this network namespace, if one is.
pub fn find_listener(ip: Ipv4Addr) -> std::io::Result<SocketAddr> {
    let text = std::fs::read_to_string("/proc/net/tcp")?;
    listeners(&text)
        .into_iter()
        .find(|addr| *addr.ip() == ip)
        .map(SocketAddr::V4)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("nothing listens on {ip}"),
            )
        })
}

/// The listening IPv4 addresses of a `/proc/net/tcp` text. Lines look like
/// `0: 0B00007F:1B59 00000000:0000 0A ...`: the address is the kernel's 32-bit value in host
/// byte order and the port is in hex.
pub fn listeners(text: &str) -> Vec<SocketAddrV4> {
    let mut found = Vec::new();
    for line in text.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 4 || fields[3] != TCP_LISTEN {
            continue;
        }
        let Some((ip, port)) = fields[1].split_once(':') else {
            continue;
        };
        let (Ok(ip), Ok(port)) = (u32::from_str_radix(ip, 16), u16::from_str_radix(port, 16))
        else {
            continue;
        };
        found.push(SocketAddrV4::new(Ipv4Addr::from(ip.to_ne_bytes()), port));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_sockets_are_found_and_others_skipped() {
        let ip = |a: Ipv4Addr| format!("{:08X}", u32::from_ne_bytes(a.octets()));
        let node = Ipv4Addr::new(127, 3, 0, 11);
        let text = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue\n\
             0: {}:1B59 00000000:0000 0A 00000000:00000000 00:00000000\n\
             1: {}:9C40 {}:1B59 01 00000000:00000000 00:00000000\n\
             garbage\n",
            ip(node),
            ip(Ipv4Addr::LOCALHOST),
            ip(node)
        );
        assert_eq!(listeners(&text), vec![SocketAddrV4::new(node, 7001)]);
    }

    #[test]
    fn a_socket_listening_here_is_found() {
        let ip = Ipv4Addr::new(127, 0, 0, 1);
        let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let text = std::fs::read_to_string("/proc/net/tcp").unwrap();
        assert!(listeners(&text).contains(&SocketAddrV4::new(ip, port)));
    }
}

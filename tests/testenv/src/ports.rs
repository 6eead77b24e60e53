//! Free TCP ports on 127.0.0.1, so several planes run side by side.
//!
//! The kernel picks a port for a socket bound to port 0; the socket is then closed and the
//! port handed to a component. Another process could grab it in between, so a plane whose
//! component reports "address already in use" is started again with new ports (see
//! `TestEnv::start`). Within this process, a port is never handed out twice.

use std::collections::HashSet;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, OnceLock};

/// A port on 127.0.0.1 that nothing listened on a moment ago.
pub(crate) fn free_port() -> io::Result<u16> {
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let handed_out = HANDED_OUT.get_or_init(Default::default);
    loop {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        if handed_out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(port)
        {
            return Ok(port);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_are_distinct() {
        let ports: std::collections::HashSet<u16> =
            (0..50).map(|_| super::free_port().unwrap()).collect();
        assert_eq!(ports.len(), 50);
    }
}

//! The `Host` names the server answers to (`--allowed-hosts`). A server bound to a
//! loopback address answers only loopback names (`localhost`, `*.localhost`, `127.x.x.x`,
//! `[::1]`) by default: a web page that rebinds its own domain's DNS to 127.0.0.1 (DNS
//! rebinding) reaches the server under that domain's name, and its requests are refused
//! before any route runs. A server bound elsewhere answers any name unless the option
//! lists them. Requests without a name (HTTP/1.0) are answered: browsers always send one.
//! The router's `check_host` layer asks [`AllowedHosts::allows`] before any route runs.

use std::net::IpAddr;

/// The `Host` names the server answers to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AllowedHosts {
    /// Any name (the default of a server bound to a non-loopback address).
    #[default]
    Any,
    /// Loopback names, and these (lower case, without port).
    Listed(Vec<String>),
}

impl AllowedHosts {
    /// From `--allowed-hosts` and the address the server listens on: `*` allows any name;
    /// a list allows loopback names and those; no list allows loopback names only when
    /// `host` is a loopback address, and any name otherwise.
    pub fn new(values: &[String], host: &str) -> Result<Self, String> {
        let values: Vec<String> = values
            .iter()
            .map(|v| v.trim().trim_end_matches('.').to_ascii_lowercase())
            .filter(|v| !v.is_empty())
            .collect();
        if values.iter().any(|v| v == "*") {
            return Ok(Self::Any);
        }
        if let Some(bad) = values
            .iter()
            .find(|v| v.contains([':', '/', ' ', '*', '@']) && v.parse::<IpAddr>().is_err())
        {
            return Err(format!(
                "`{bad}` is not a host name: write a name or an address without port, such as api.example.com, or *"
            ));
        }
        Ok(
            if values.is_empty() && !is_loopback_name(host.trim_matches(['[', ']'])) {
                Self::Any
            } else {
                Self::Listed(values)
            },
        )
    }

    /// Whether a request naming `authority` (`host[:port]`) is answered.
    pub fn allows(&self, authority: &str) -> bool {
        let Self::Listed(names) = self else {
            return true;
        };
        let name = host_name(authority).to_ascii_lowercase();
        let name = name.trim_end_matches('.');
        is_loopback_name(name) || names.iter().any(|n| n == name)
    }
}

/// The host of `host[:port]`, an IPv6 literal without its brackets.
fn host_name(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

fn is_loopback_name(name: &str) -> bool {
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_server_answers_loopback_names_only_unless_told() {
        let local = AllowedHosts::new(&[], "127.0.0.1").unwrap();
        for ok in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "app.localhost:3",
            "[::1]:8080",
            "127.1.2.3",
        ] {
            assert!(local.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "localhost.evil",
            "[::2]:1",
        ] {
            assert!(!local.allows(bad), "{bad}");
        }
        assert_eq!(AllowedHosts::new(&[], "::1").unwrap(), local);
        assert_eq!(AllowedHosts::new(&[], "localhost").unwrap(), local);
        // Bound elsewhere: any name, unless listed.
        let open = AllowedHosts::new(&[], "0.0.0.0").unwrap();
        assert!(open.allows("evil.example"));
        let listed = AllowedHosts::new(&["API.example.".into()], "0.0.0.0").unwrap();
        assert!(listed.allows("api.example:443") && listed.allows("localhost"));
        assert!(!listed.allows("evil.example"));
        assert_eq!(
            AllowedHosts::new(&["*".into()], "127.0.0.1").unwrap(),
            AllowedHosts::Any
        );
        for bad in ["api.example:80", "https://api.example", "*.example"] {
            assert!(
                AllowedHosts::new(&[bad.into()], "127.0.0.1").is_err(),
                "{bad}"
            );
        }
        assert!(AllowedHosts::new(&["::1".into()], "127.0.0.1").is_ok());
    }
}

//! memcached's ASCII authentication (`-Y FILE`): a file of `user:password` lines, and a
//! connection that must first send `set <any key> <flags> <exptime> <length>` with
//! `user password` as its data. Until then every request is answered
//! `CLIENT_ERROR unauthenticated` (and changes nothing); a wrong password is
//! `CLIENT_ERROR authentication failure`, counted in `auth_errors`; every attempt counts in
//! `auth_cmds`. Passwords are compared in constant time.

use std::path::Path;

/// The users of an auth file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthFile {
    users: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Why an auth file was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    /// It could not be read.
    #[error("cannot read {0}: {1}")]
    Read(String, std::io::Error),
    /// A line has no `:` (memcached: "malformed").
    #[error("{0}: line {1} is not user:password")]
    Malformed(String, usize),
}

impl AuthFile {
    /// Reads `path`: one `user:password` per line (the password runs to the end of the
    /// line; a `\r` before the newline is not part of it).
    pub fn load(path: &Path) -> Result<AuthFile, AuthFileError> {
        let name = path.display().to_string();
        let text = std::fs::read(path).map_err(|e| AuthFileError::Read(name.clone(), e))?;
        Self::parse(&text).map_err(|line| AuthFileError::Malformed(name, line))
    }

    /// Parses the file's bytes; `Err(line)` names the first malformed line (1-based).
    pub fn parse(text: &[u8]) -> Result<AuthFile, usize> {
        let mut users = Vec::new();
        for (i, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                return Err(i + 1);
            };
            users.push((line[..colon].to_vec(), line[colon + 1..].to_vec()));
        }
        Ok(AuthFile { users })
    }

    /// Whether `user` with `password` is in the file.
    pub fn check(&self, user: &[u8], password: &[u8]) -> bool {
        let mut ok = false;
        for (u, p) in &self.users {
            ok |= same(u, user) & same(p, password);
        }
        ok
    }

    /// The auth `set`'s data: `user password` (more tokens are ignored, as in memcached);
    /// `None` when there are fewer than two.
    pub fn credentials(data: &[u8]) -> Option<(&[u8], &[u8])> {
        let mut tokens = data.split(|&b| b == b' ').filter(|t| !t.is_empty());
        Some((tokens.next()?, tokens.next()?))
    }
}

/// Compares without an early exit on the first differing byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_and_passwords() {
        let f = AuthFile::parse(b"alice:s3cret\r\nbob:pa:ss word\n\n").expect("parses");
        assert!(f.check(b"alice", b"s3cret"));
        assert!(f.check(b"bob", b"pa:ss word"));
        assert!(!f.check(b"alice", b"s3cre"));
        assert!(!f.check(b"bob", b"s3cret"));
        assert!(!f.check(b"carol", b""));
        assert_eq!(AuthFile::parse(b"ok:1\nnocolon\n"), Err(2));
        assert_eq!(
            AuthFile::credentials(b"alice  s3cret extra"),
            Some((&b"alice"[..], &b"s3cret"[..]))
        );
        assert_eq!(AuthFile::credentials(b"alice"), None);
    }
}

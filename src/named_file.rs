//! A file the config names by path (a certificate, a key, a CA bundle, the
//! admin token), read whole: only a regular file, and at most a bound. A
//! config naming a device or a FIFO (`/dev/zero`, a pipe nobody writes to)
//! gets an error naming its key, not a load that never ends: opened
//! without blocking (opening a FIFO waits for a writer, in a `baton check`
//! or a reload, before any check could run).

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum NamedFileError {
    #[error("cannot read: {}{}", .0, refused_as(.0))]
    Read(std::io::Error),
    #[error("is not a regular file")]
    NotAFile,
    #[error("is larger than {0} bytes")]
    TooLarge(u64),
}

/// Who was refused, when a file could not be read for its permissions:
/// under the unit the daemon reads as the service's user, not as the root
/// who wrote the file (certbot's keys are root's alone); a command reads
/// as whoever runs it.
pub fn refused_as(err: &std::io::Error) -> String {
    match err.kind() {
        std::io::ErrorKind::PermissionDenied => {
            format!(" (read as uid {})", nix::unistd::getuid())
        }
        _ => String::new(),
    }
}

/// `path`'s bytes, if it is a regular file of at most `most` bytes.
pub fn read(path: &Path, most: u64) -> Result<Vec<u8>, NamedFileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(NamedFileError::Read)?;
    if !file.metadata().map_err(NamedFileError::Read)?.is_file() {
        return Err(NamedFileError::NotAFile);
    }
    let mut bytes = Vec::new();
    file.take(most + 1)
        .read_to_end(&mut bytes)
        .map_err(NamedFileError::Read)?;
    if bytes.len() as u64 > most {
        return Err(NamedFileError::TooLarge(most));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_within_the_bound_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let small = dir.path().join("small");
        std::fs::write(&small, b"token").expect("write");
        assert_eq!(read(&small, 5).expect("read"), b"token");
        assert!(matches!(read(&small, 4), Err(NamedFileError::TooLarge(4))));
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        assert!(matches!(read(&fifo, 5), Err(NamedFileError::NotAFile)));
        assert!(matches!(
            read(Path::new("/dev/zero"), 5),
            Err(NamedFileError::NotAFile)
        ));
        assert!(matches!(
            read(&dir.path().join("missing"), 5),
            Err(NamedFileError::Read(_))
        ));
    }
}

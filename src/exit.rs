//! How a baton process ends: DESIGN.md's exit-code table, in one place.
//! Every command and every generation ends with one of these; a code read
//! from another process (a reload's reply, a new generation's failure)
//! comes back through [`Exit::from_code`].

/// An exit status with a meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: everything drained; the command did what it was asked.
    Clean,
    /// 1: a runtime failure (a listener not bound, a broken handoff, ...).
    Failure,
    /// 2: a usage error (clap exits with it on its own).
    Usage,
    /// 3: stopped, but the drain deadline forced connections closed.
    Forced,
    /// 69: `reload`/`status`/`backend`: the daemon cannot be reached (or,
    /// for `reload`, its control socket refused the caller).
    Unreachable,
    /// 75: `reload` refused: one is already under way (retry).
    Busy,
    /// 78: the config is invalid (so `RestartPreventExitStatus=78` stops
    /// restart loops).
    Config,
}

impl Exit {
    pub const fn code(self) -> i32 {
        match self {
            Exit::Clean => 0,
            Exit::Failure => 1,
            Exit::Usage => 2,
            Exit::Forced => 3,
            Exit::Unreachable => 69,
            Exit::Busy => 75,
            Exit::Config => 78,
        }
    }

    /// The meaning of a code another baton process sent; one outside the
    /// table is a failure.
    pub fn from_code(code: i32) -> Exit {
        [
            Exit::Clean,
            Exit::Usage,
            Exit::Forced,
            Exit::Unreachable,
            Exit::Busy,
            Exit::Config,
        ]
        .into_iter()
        .find(|e| e.code() == code)
        .unwrap_or(Exit::Failure)
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        std::process::ExitCode::from(exit.code() as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::Exit;

    #[test]
    fn codes_read_back_as_what_they_mean() {
        for exit in [
            Exit::Clean,
            Exit::Failure,
            Exit::Usage,
            Exit::Forced,
            Exit::Unreachable,
            Exit::Busy,
            Exit::Config,
        ] {
            assert_eq!(Exit::from_code(exit.code()), exit);
        }
        assert_eq!(Exit::from_code(42), Exit::Failure);
    }
}

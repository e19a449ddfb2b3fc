//! Failure certainty: which Redis errors prove nothing was mutated, and which leave it open.

use ::redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::contract::{IncompatibleCause, IndeterminateCause, UnavailableCause};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Unavailable(UnavailableCause),
    Indeterminate(IndeterminateCause),
    Incompatible(IncompatibleCause),
}

impl Failure {
    /// Whether the connection that produced this error should be replaced.
    pub fn breaks_connection(self) -> bool {
        matches!(
            self,
            Failure::Indeterminate(IndeterminateCause::ConnectionLost)
                | Failure::Unavailable(UnavailableCause::ConnectFailed)
        )
    }
}

/// Classifies an error returned for a command that was handed to the connection.
///
/// Server error replies that Redis sends *instead of* running a script (LOADING, BUSY,
/// READONLY, MASTERDOWN, OOM, NOPERM, ...) prove the script did not run: unavailable.
/// Transport errors after dispatch may hide an executed script: indeterminate.
pub fn classify(error: &RedisError) -> Failure {
    if error.is_connection_refusal() {
        return Failure::Unavailable(UnavailableCause::ConnectFailed);
    }
    match error.kind() {
        ErrorKind::Server(kind) => match kind {
            ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::MasterDown
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::NoPerm
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask => Failure::Unavailable(UnavailableCause::ServerRefused),
            ServerErrorKind::NoScript => Failure::Incompatible(IncompatibleCause::ProgramError),
            ServerErrorKind::CrossSlot => Failure::Incompatible(IncompatibleCause::ProgramError),
            ServerErrorKind::ResponseError
            | ServerErrorKind::ExecAbort
            | ServerErrorKind::NotBusy
            | ServerErrorKind::NoSub => response_error(error),
            _ => Failure::Incompatible(IncompatibleCause::ProgramError),
        },
        ErrorKind::Extension => match error.code() {
            Some("BUSY") | Some("OOM") | Some("NOAUTH") | Some("MISCONF") => {
                Failure::Unavailable(UnavailableCause::ServerRefused)
            }
            Some("WRONGTYPE") => Failure::Incompatible(IncompatibleCause::WrongType),
            _ => response_error(error),
        },
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
            Failure::Incompatible(IncompatibleCause::MalformedReply)
        }
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig => {
            Failure::Unavailable(UnavailableCause::ConnectFailed)
        }
        ErrorKind::Io => {
            if error.is_timeout() {
                Failure::Indeterminate(IndeterminateCause::Timeout)
            } else {
                Failure::Indeterminate(IndeterminateCause::ConnectionLost)
            }
        }
        _ => Failure::Indeterminate(IndeterminateCause::AfterDispatch),
    }
}

/// `ERR ...` replies: a script that failed while running, or a wrong-typed key. The programs
/// check the key type before any write, so these are program/state mismatches.
fn response_error(error: &RedisError) -> Failure {
    let detail = error.detail().unwrap_or_default();
    if error.code() == Some("WRONGTYPE") || detail.contains("WRONGTYPE") {
        Failure::Incompatible(IncompatibleCause::WrongType)
    } else {
        Failure::Incompatible(IncompatibleCause::ProgramError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn refusals_are_unavailable_transport_losses_indeterminate() {
        let refused = RedisError::from(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(
            classify(&refused),
            Failure::Unavailable(UnavailableCause::ConnectFailed)
        );
        let reset = RedisError::from(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(
            classify(&reset),
            Failure::Indeterminate(IndeterminateCause::ConnectionLost)
        );
        assert!(classify(&reset).breaks_connection());
        let loading =
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
        assert_eq!(
            classify(&loading),
            Failure::Unavailable(UnavailableCause::ServerRefused)
        );
        let readonly = RedisError::from((ErrorKind::Server(ServerErrorKind::ReadOnly), "ro"));
        assert_eq!(
            classify(&readonly),
            Failure::Unavailable(UnavailableCause::ServerRefused)
        );
        let parse = RedisError::from((ErrorKind::Parse, "bad"));
        assert_eq!(
            classify(&parse),
            Failure::Incompatible(IncompatibleCause::MalformedReply)
        );
    }
}

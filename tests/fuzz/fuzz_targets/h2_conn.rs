//! A whole h2 connection fed what a client could send after its preface
//! (see `h2_drive`): every input ends the connection (by its end, an error
//! or, at worst, the keep-alive PING's timeout, in paused time), never a
//! panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "h2_drive.rs"]
mod h2_drive;

fuzz_target!(|bytes: &[u8]| {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    else {
        return;
    };
    let ended = runtime.block_on(h2_drive::connection_ends(bytes));
    assert!(ended, "the connection outlived an hour of paused time");
});

//! `polis-pause`: the process every Kubernetes pod sandbox of a Polis worker holds its
//! namespaces with (the "pause" container), built statically by
//! `scripts/kubernetes-images` and shipped in the project's own sandbox image: no
//! registry is reachable, and no image is downloaded.
//!
//! It sleeps until SIGINT or SIGTERM (then exits 0) and, as PID 1 of a pod that shares
//! its PID namespace, reaps every child that is orphaned to it.

fn main() {
    // SAFETY: installs async-signal-safe handlers (they only call waitpid and _exit),
    // then waits for signals; nothing else runs.
    unsafe {
        libc::signal(libc::SIGINT, quit as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, quit as *const () as libc::sighandler_t);
        libc::signal(libc::SIGCHLD, reap as *const () as libc::sighandler_t);
        loop {
            libc::pause();
        }
    }
}

extern "C" fn quit(_: libc::c_int) {
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(0) }
}

extern "C" fn reap(_: libc::c_int) {
    // SAFETY: waitpid is async-signal-safe; reaps every exited child, blocks on none.
    unsafe { while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {} }
}

//! The HTTP server around the API: connection limits and timeouts, the
//! middleware every request passes (Host check, CORS), and the shutdown on
//! SIGTERM/SIGINT with its grace period.

use std::net::IpAddr;
use std::time::Duration;

use actix_web::middleware::{from_fn, Condition};
use actix_web::{web, App, HttpServer};

use crate::api::{self, cors, host_check, AppState};
use crate::cli::ServeArgs;
use crate::error::{Error, Result};

/// After the grace period, the time cut responses get to reach their clients
/// before the remaining connections are closed.
const CUT_FLUSH: Duration = Duration::from_secs(5);

/// Whether `host` (as `--host` gives it) is reachable only from this machine.
pub fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost") || host.trim_matches(|c| c == '[' || c == ']').parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The loud warning for a server that others can reach and anyone may use.
fn warn_if_exposed(args: &ServeArgs, has_key: bool) {
    if is_loopback(&args.host) || has_key {
        return;
    }
    let line = "!".repeat(78);
    eprintln!("WARNING {line}");
    eprintln!("WARNING: listening on {} (not loopback) WITHOUT --api-key: anyone who can reach", args.host);
    eprintln!("WARNING: this port can run the model, read /metrics and fill the queue.");
    eprintln!("WARNING: Set --api-key (or MLX_SERVE_API_KEY), or bind --host 127.0.0.1.");
    eprintln!("WARNING {line}");
}

/// Waits for SIGTERM or SIGINT.
async fn termination() {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        (Err(e), _) | (_, Err(e)) => {
            log::error!("cannot listen for SIGTERM/SIGINT ({e}); stop the server with SIGKILL");
            std::future::pending::<()>().await
        }
    }
}

/// On the first SIGTERM/SIGINT: stop accepting connections, let running
/// requests finish for `grace`, then cut what is left (a second signal cuts
/// at once).
async fn shut_down_on_signal(server: actix_web::dev::ServerHandle, state: web::Data<AppState>, grace: Duration) {
    termination().await;
    let (running, queued) = (state.engine.stats.read().running, state.engine.queued());
    log::warn!("shutting down: {running} running and {queued} queued requests have {} s to finish", grace.as_secs());
    // Sent at once; the returned future only reports completion.
    drop(server.stop(true));
    tokio::select! {
        () = tokio::time::sleep(grace) => {}
        () = termination() => log::warn!("a second signal: cutting the running requests now"),
    }
    state.shutdown.cut_now();
}

/// Serves `state` until a shutdown signal, as the flags in `args` say.
/// Err(CutAtShutdown) when the grace period ended with requests still running.
pub fn run(state: web::Data<AppState>, args: &ServeArgs) -> Result<()> {
    if args.max_connections == 0 {
        return Err(Error::Config("--max-connections must be at least 1".into()));
    }
    cors::check_origins(&args.cors_origin).map_err(Error::Config)?;
    warn_if_exposed(args, state.api_key.is_set());
    // actix limits connections per worker: split the total between them.
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let workers = cores.min(args.max_connections);
    let per_worker = args.max_connections.div_ceil(workers);
    let grace = Duration::from_secs(args.shutdown_grace_secs);
    let (host, port) = (args.host.clone(), args.port);
    let cors_origins = args.cors_origin.clone();
    let header_timeout = Duration::from_secs(args.header_timeout_secs.max(1));
    let app_state = state.clone();
    actix_web::rt::System::new().block_on(async move {
        let server = HttpServer::new(move || {
            let cors = cors::policy(&cors_origins);
            App::new()
                .app_data(app_state.clone())
                .configure(api::routes)
                // The last wrapped runs first: a refused Host gets no CORS headers.
                .wrap(Condition::new(cors.is_some(), cors.unwrap_or_default()))
                .wrap(from_fn(host_check::reject_unknown_hosts))
        })
        .workers(workers)
        .max_connections(per_worker)
        // 408 to a client that does not finish its headers in time.
        .client_request_timeout(header_timeout)
        // A client that closes its connection mid-request has gone: actix then
        // drops the handler, and with it the request's event channel, so the
        // engine stops generating for it at its next step (streamed or not).
        .h1_allow_half_closed(false)
        .disable_signals()
        .shutdown_timeout((grace + CUT_FLUSH).as_secs())
        .bind((host.as_str(), port))
        .map_err(|e| Error::Startup(format!("cannot listen on {host}:{port}: {e}")))?;
        for addr in server.addrs() {
            // Tests and scripts read this line to find a port chosen with --port 0.
            eprintln!("mlx-serve: listening on http://{addr}");
        }
        let server = server.run();
        actix_web::rt::spawn(shut_down_on_signal(server.handle(), state.clone(), grace));
        actix_web::rt::spawn(reset_peak_memory_on_sigusr1(state.clone()));
        server.await.map_err(|e| Error::Startup(format!("server error: {e}")))
    })
}

/// `kill -USR1 PID` zeroes MLX's peak-memory counter, as writing 5 to /proc/PID/clear_refs does
/// for the RSS high-water mark, so a benchmark can read the peak of one phase from /health
/// or /metrics. The engine thread does the reset (every MLX call happens there) and
/// publishes its stats at once, also when idle.
async fn reset_peak_memory_on_sigusr1(state: web::Data<AppState>) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut usr1 = match signal(SignalKind::user_defined1()) {
        Ok(s) => s,
        Err(e) => return log::warn!("SIGUSR1 (peak-memory reset) is not available: {e}"),
    };
    while usr1.recv().await.is_some() {
        if state.engine.reset_peak_memory().is_err() {
            log::warn!("SIGUSR1: the engine has stopped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_recognised() {
        for h in ["127.0.0.1", "localhost", "::1", "[::1]", "127.1.2.3"] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["0.0.0.0", "::", "192.168.1.2", "myhost.example"] {
            assert!(!is_loopback(h), "{h}");
        }
    }
}

/*
 * The snapshot file of the logins (its format: store.c): written by a
 * forked child when something changed, every snapshot_interval seconds,
 * and at shutdown.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "plugin.h"

double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void save_now(struct plugin *p)
{
	char err[256];
	double t0 = mono_s();
	uint64_t changes = p->st.changes;
	if (snapshot_save(&p->st, p->snapshot_file, err, sizeof(err)) < 0) {
		snprintf(p->last_error, sizeof(p->last_error), "%s", err);
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "snapshot not saved: %s", err);
		return;
	}
	p->saved_changes = changes;
	p->last_save_ms = (mono_s() - t0) * 1000;
	p->last_save_time = time(NULL);
	p->last_save_devices = store_count(&p->st);
	p->last_error[0] = '\0';
	mosquitto_log_printf(MOSQ_LOG_INFO, LOG_PREFIX "snapshot saved: %zu devices in %.0f ms",
			p->last_save_devices, p->last_save_ms);
}

/* Forks a child that writes the store as it is now (copy-on-write pages)
 * and exits; the broker goes on at once. The Redis BGSAVE way. */
static void start_background_save(struct plugin *p)
{
	int fds[2];
	if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) {
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "snapshot: pipe: %s", strerror(errno));
		return;
	}
	double t0 = mono_s();
	pid_t pid = fork();
	if (pid < 0) {
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "snapshot: fork: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return;
	}
	if (pid == 0) {
		/* The child holds none of the broker's sockets (a restarted
		 * broker must be able to listen while it writes) and reports a
		 * failure on fd 2. */
		char err[256];
		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
		dup2(fds[1], 2);
		if (close_range(3, ~0U, 0) < 0) {
			for (int fd = 3; fd < 65536; fd++) close(fd);
		}
		if (snapshot_save(&p->st, p->snapshot_file, err, sizeof(err)) < 0) {
			ssize_t w = write(2, err, strlen(err));
			(void)w;
			_exit(1);
		}
		_exit(0);
	}
	close(fds[1]);
	p->child = pid;
	p->child_pipe = fds[0];
	p->child_changes = p->st.changes;
	p->child_devices = store_count(&p->st);
	p->child_started = mono_s();
	p->last_fork_ms = (p->child_started - t0) * 1000;
}

/* Reaps the child (blocking or not); true if it is gone. */
bool reap_child(struct plugin *p, bool block)
{
	int status;
	pid_t r;
	if (p->child <= 0) return true;
	do {
		r = waitpid(p->child, &status, block ? 0 : WNOHANG);
	} while (r < 0 && errno == EINTR);
	if (r == 0) return false;
	char err[256] = "";
	ssize_t n = read(p->child_pipe, err, sizeof(err) - 1);
	err[n > 0 ? n : 0] = '\0';
	close(p->child_pipe);
	p->child_pipe = -1;
	if (r == p->child && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		p->saved_changes = p->child_changes;
		p->last_save_ms = (mono_s() - p->child_started) * 1000;
		p->last_save_time = time(NULL);
		p->last_save_devices = p->child_devices;
		p->last_error[0] = '\0';
		mosquitto_log_printf(MOSQ_LOG_INFO,
				LOG_PREFIX "snapshot saved in the background: %zu devices in %.0f ms (fork %.1f ms)",
				p->child_devices, p->last_save_ms, p->last_fork_ms);
	} else {
		if (!err[0]) snprintf(err, sizeof(err), "writer ended with status %d", status);
		snprintf(p->last_error, sizeof(p->last_error), "%s", err);
		mosquitto_log_printf(MOSQ_LOG_ERR, LOG_PREFIX "snapshot not saved: %s", err);
	}
	p->child = 0;
	return true;
}

int on_tick(int event, void *event_data, void *userdata)
{
	(void)event;
	(void)event_data;
	struct plugin *p = userdata;
	/* A growing table moves a share of its buckets while the broker idles. */
	store_rehash_step(&p->st, 4096);
	if (!p->snapshot_file) return MOSQ_ERR_SUCCESS;
	if (p->child > 0 && !reap_child(p, false)) return MOSQ_ERR_SUCCESS;
	double now = mono_s();
	if (now < p->next_check) return MOSQ_ERR_SUCCESS;
	p->next_check = now + (double)p->snapshot_interval;
	if (p->st.changes != p->saved_changes) start_background_save(p);
	return MOSQ_ERR_SUCCESS;
}


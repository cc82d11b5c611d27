/* A tiny, fast-starting test program for the srtr benchmarks (built by benchmarks/common.py).
 *
 *   helper listen IP PORT DELAY   sleep DELAY seconds, then listen on IP:PORT; run until killed
 *   helper mark FILE              append "PID EPOCH_SECONDS" to FILE, then run until killed
 *   helper hold                   run until killed, ignoring SIGTERM (only SIGKILL ends it)
 *
 * Python would do, but 32 Python interpreters starting at once on 2 cores cost ~0.4 s of CPU
 * contention, which the fan-out figure would then measure instead of srtr.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int usage(void) {
    fprintf(stderr, "usage: helper listen IP PORT DELAY | mark FILE | hold\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    if (strcmp(argv[1], "mark") == 0 && argc == 3) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        char line[64];
        int n = snprintf(line, sizeof line, "%d %lld.%09ld\n", (int)getpid(),
                         (long long)now.tv_sec, now.tv_nsec);
        int fd = open(argv[2], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0 || write(fd, line, n) != n) { perror(argv[2]); return 1; }
        close(fd);
    } else if (strcmp(argv[1], "listen") == 0 && argc == 5) {
        double delay = atof(argv[4]);
        struct timespec ts = {(time_t)delay, (long)((delay - (time_t)delay) * 1e9)};
        while (nanosleep(&ts, &ts) != 0) {}
        int s = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in addr = {0};
        addr.sin_family = AF_INET;
        addr.sin_port = htons((unsigned short)atoi(argv[3]));
        if (inet_pton(AF_INET, argv[2], &addr.sin_addr) != 1) return usage();
        if (bind(s, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(s, 64) != 0) {
            perror("bind/listen");
            return 1;
        }
    } else if (strcmp(argv[1], "hold") == 0 && argc == 2) {
        signal(SIGTERM, SIG_IGN);
    } else {
        return usage();
    }
    for (;;) pause();
}

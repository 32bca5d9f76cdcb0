/*
 * cli_plot.h - SVG line plot of a loss curve (cli_plot.c).
 */
#ifndef MOEX_CLI_PLOT_H
#define MOEX_CLI_PLOT_H

#include <stdint.h>

/* Writes an SVG plot of y[0..n) against the index 0..n-1 (linear x axis, log10 y axis;
 * values that are not finite and positive are left out). The strings are written as
 * they are (no XML escaping): pass plain text. Returns 0, or -1 with errno set. */
int cli_plot_svg(const char *path, const char *title, const char *xlabel, const char *ylabel,
                 const double *y, int64_t n);

#endif /* MOEX_CLI_PLOT_H */

// Command dlock runs commands under a distributed lease and inspects lock
// stores. See "dlock --help" and package internal/cli.
package main

import (
	"context"
	"os"

	"github.com/dlock-dev/dlock/internal/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

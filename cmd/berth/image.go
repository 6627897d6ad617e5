package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"github.com/docker/go-units"
	"github.com/spf13/cobra"

	"github.com/berthci/berth/vmimage"
)

// imageFlags are the flags of every image subcommand.
type imageFlags struct {
	dir     string
	asJSON  bool
	verbose bool
}

func (f *imageFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.dir, "dir", "", "cache directory (default: ~/.cache/berth/vmimages)")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVarP(&f.verbose, "verbose", "v", false, "debug lines on stderr")
}

// store is the vmimage store, its progress lines on stderr.
func (f *imageFlags) store(cmd *cobra.Command) *vmimage.Store {
	level := slog.LevelInfo
	if f.verbose {
		level = slog.LevelDebug
	}
	return &vmimage.Store{Dir: f.dir, Logger: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))}
}

func newImageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build and cache microVM root filesystems from container images, and the kernel and initramfs VMs boot",
		Long: "Root filesystems are built from images of the Docker engine (or OCI image layout directories),\n" +
			"cached by image digest and shared read-only by every VM; see docs/vm-images.md.",
	}
	cmd.AddCommand(newImageBuildCmd(), newImageListCmd(), newImagePruneCmd(), newImageBootFilesCmd())
	return cmd
}

func newImageBuildCmd() *cobra.Command {
	var (
		f      imageFlags
		format string
		o      vmimage.BuildOptions
	)
	cmd := &cobra.Command{
		Use:   "build IMAGE[:TAG]",
		Short: "Build (or find cached) the root filesystem of an image of the Docker engine or an OCI layout",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Format = vmimage.Format(format)
			img, err := f.store(cmd).Build(cmd.Context(), args[0], o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if f.asJSON {
				return json.NewEncoder(out).Encode(img)
			}
			fmt.Fprintf(out, "name    %s\n", img.Name)
			fmt.Fprintf(out, "digest  %s\n", img.Digest)
			fmt.Fprintf(out, "format  %s\n", img.Format)
			fmt.Fprintf(out, "path    %s\n", img.Path)
			fmt.Fprintf(out, "size    %d (%s)\n", img.Size, units.BytesSize(float64(img.Size)))
			return nil
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&format, "format", string(vmimage.FormatExt4), "file system: ext4 (writable) or erofs (read-only, compact)")
	fl.StringVar(&o.OCILayout, "oci-layout", "", "build from this OCI image layout directory instead of the Docker engine")
	fl.StringVar(&o.Tag, "tag", "", "with --oci-layout of several manifests: the org.opencontainers.image.ref.name to build")
	return cmd
}

func newImageListCmd() *cobra.Command {
	var f imageFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the cached root filesystems",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			imgs, err := f.store(cmd).List()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if f.asJSON {
				if imgs == nil {
					imgs = []*vmimage.Image{}
				}
				return json.NewEncoder(out).Encode(imgs)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tDIGEST\tFORMAT\tSIZE\tBUILT\tLAST USED\tPATH")
			for _, img := range imgs {
				fmt.Fprintf(tw, "%s\t%.19s\t%s\t%s\t%s\t%s\t%s\n", img.Name, img.Digest, img.Format, units.BytesSize(float64(img.Size)),
					img.Built.Local().Format(time.DateTime), img.Used.Local().Format(time.DateTime), img.Path)
			}
			return tw.Flush()
		},
	}
	f.register(cmd)
	return cmd
}

func newImagePruneCmd() *cobra.Command {
	var (
		f    imageFlags
		keep time.Duration
	)
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Remove root filesystems and initramfs files not used for --keep",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.store(cmd).Prune(keep)
		},
	}
	f.register(cmd)
	cmd.Flags().DurationVar(&keep, "keep", 7*24*time.Hour, "keep what was used this recently")
	return cmd
}

func newImageBootFilesCmd() *cobra.Command {
	var (
		f imageFlags
		o vmimage.BootOptions
	)
	cmd := &cobra.Command{
		Use:   "boot-files",
		Short: "Build (or find cached) the initramfs microVMs boot, and print it with the kernel",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := f.store(cmd).BootFiles(cmd.Context(), o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if f.asJSON {
				return json.NewEncoder(out).Encode(b)
			}
			fmt.Fprintf(out, "kernel          %s\n", b.Kernel)
			fmt.Fprintf(out, "kernel version  %s\n", b.KernelVersion)
			fmt.Fprintf(out, "initramfs       %s", b.Initramfs)
			if fi, err := os.Stat(b.Initramfs); err == nil {
				fmt.Fprintf(out, " (%s)", units.BytesSize(float64(fi.Size())))
			}
			fmt.Fprintln(out)
			return nil
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&o.Kernel, "kernel", "", "kernel image (default: the newest /boot/vmlinuz-*)")
	fl.StringVar(&o.Modules, "modules", "", "the kernel's module directory (default: /lib/modules/<kernel version>)")
	fl.StringVar(&o.Agent, "agent", "", "berth binary run as the agent (default: this one)")
	fl.StringVar(&o.Busybox, "busybox", "", "static busybox (default: /bin/busybox)")
	return cmd
}
